"""The longest sequence one trainer rank can train within a fixed memory cap, Ulysses sp=2 against sp=1 (issue 46,
part 5: sp=2 trains a sequence at least 1.8x as long as sp=1 within the same per-rank cap).

A narrow Qwen2 (hidden 256, 4 attention heads, 2 KV heads, 4 layers, vocabulary 2048, float32, no gradient
checkpointing) runs the actor's call, rlkit.trainer.head_logprobs.model_token_logprobs(..., with_entropy=True) on one
packed row of L tokens, then backward of the log-probs' sum: sp=1 is today's path (one rank, the whole row), sp=2
is `actor.fsdp.ulysses_sp_size=2` (two gloo ranks, rlkit.models.ulysses: each holds L/2 tokens, heads exchanged by
all-to-all). Each (sp, L) runs in fresh processes; a rank's cost is its peak resident memory (ru_maxrss) over its
resident memory just before the step, and a run's is its largest rank's. The floor is sp=1 measured in the same run.
For each sp the length grows (doubling from --start, then bisection to --resolution tokens) to the longest L whose
cost stays within --cap-mib. A length's cost is the median of --repeat runs: the same length's peak moves by up to
10% from run to run (glibc's heap), and one lucky run would otherwise decide the bisection. Weights and optimizer
are not part of it (replicated, no FSDP: the narrow model's are a few MB, the same at any L and sp).

Run: `PYTHONPATH=. python bench/bench_ulysses.py [--cap-mib 256]`; writes bench/results/cpu-ulysses.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from process_memory import peak_rss_bytes, rss_bytes  # noqa: E402  (bench/, this script's own folder)

SHAPE = {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2}
MIB = 1024**2
WARM_UP_TOKENS = 64
MMAP_THRESHOLD = 0  # --mmap-threshold: 0 leaves glibc's dynamic threshold
REPEAT = 3  # --repeat: runs per length, the median decides


def child(sp: int, tokens: int) -> dict[str, Any]:
    """One rank's forward + backward of a row of `tokens` in this (fresh) process; its peak over its start."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlkit.models import ulysses
    from rlkit.models.packing import set_packing
    from rlkit.trainer.dist import init_sequence_parallel
    from rlkit.trainer.head_logprobs import model_token_logprobs

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPE, max_position_embeddings=tokens + 1, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).float()
    set_packing(model, True)
    if init_sequence_parallel(sp) is not None:
        ulysses.enable(model)
    # a warm-up step on a short row first: the one-time costs of a first step (gloo's buffers for the all-to-all and
    # the gather, lazily built kernels and autograd functions) are the same at any L, like the weights, and a
    # trainer pays them once per run; the measured step is the second, as in every step of a real run after the first
    warm = torch.randint(0, SHAPE["vocab_size"], (1, WARM_UP_TOKENS), generator=torch.Generator().manual_seed(2))
    model_token_logprobs(model, warm, torch.ones_like(warm), with_entropy=True)[0].sum().backward()
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    before = rss_bytes()
    started = time.perf_counter()
    logp, entropy = model_token_logprobs(model, ids, mask, with_entropy=True)
    assert entropy is not None and bool(torch.isfinite(logp).all())
    logp.sum().backward()
    seconds = time.perf_counter() - started
    peak = peak_rss_bytes() - before
    dist.barrier()
    return {"peak_over_start_bytes": peak, "seconds": round(seconds, 2)}


def run(sp: int, tokens: int) -> dict[str, Any]:
    """One step at `tokens` on `sp` fresh rank processes: the largest rank's cost, and the slowest rank's time."""
    from rlkit.servers.health import find_free_port

    port = find_free_port()
    procs = []
    for rank in range(sp):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": str(sp),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        if MMAP_THRESHOLD:  # glibc: blocks this large are mmapped and unmapped when freed, never kept in the heap
            env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", str(sp), str(tokens)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    ranks = []
    for proc in procs:
        out, err = proc.communicate(timeout=1200)
        if proc.returncode != 0:
            raise RuntimeError(f"sp={sp} at {tokens} tokens failed:\n{err[-3000:]}")
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    return {"bytes": max(r["peak_over_start_bytes"] for r in ranks), "seconds": max(r["seconds"] for r in ranks),
            "ranks": ranks}


def longest_within(sp: int, cap: int, start: int, resolution: int) -> tuple[int, dict[int, dict[str, Any]]]:
    """The longest row (a multiple of `resolution`) whose step costs at most `cap` bytes per rank, and every run."""
    runs: dict[int, dict[str, Any]] = {}

    def fits(tokens: int) -> bool:
        repeats = [run(sp, tokens) for _ in range(REPEAT)]
        costs = sorted(r["bytes"] for r in repeats)
        runs[tokens] = {"bytes": costs[len(costs) // 2], "seconds": max(r["seconds"] for r in repeats),
                        "repeats": repeats}
        print(f"  sp={sp} {tokens:7d} tokens: {runs[tokens]['bytes'] / MIB:7.1f} MiB per rank, the median of "
              f"{', '.join(f'{c / MIB:.1f}' for c in costs)} ({runs[tokens]['seconds']:.1f} s)", flush=True)
        return bool(runs[tokens]["bytes"] <= cap)

    low, high = 0, start
    while fits(high):
        low, high = high, high * 2
    while high - low > resolution:
        middle = (low + high) // 2 // resolution * resolution
        if middle in (low, high):
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cap-mib", type=int, default=256)
    parser.add_argument("--start", type=int, default=2048)
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-ulysses.json")
    parser.add_argument("--mmap-threshold", type=int, default=0,
                        help="run the ranks with glibc's MALLOC_MMAP_THRESHOLD_ fixed at this many bytes, so that "
                        "freed tensors leave the resident set at once and the peak follows the live tensors (as a "
                        "GPU's allocated memory does); 0: glibc's default, which keeps freed blocks below a growing "
                        "threshold in its heap")
    parser.add_argument("--repeat", type=int, default=3, help="runs per length; their median peak decides")
    parser.add_argument("--child", nargs=2, metavar=("SP", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), int(args.child[1]))))
        return 0

    global MMAP_THRESHOLD, REPEAT
    MMAP_THRESHOLD, REPEAT = args.mmap_threshold, max(1, args.repeat)
    cap = args.cap_mib * MIB
    longest: dict[int, int] = {}
    runs: dict[str, Any] = {}
    for sp in (1, 2):
        longest[sp], found = longest_within(sp, cap, args.start, args.resolution)
        runs[f"sp{sp}"] = {str(t): r for t, r in sorted(found.items())}
        print(f"sp={sp}: longest row within {args.cap_mib} MiB per rank: {longest[sp]} tokens", flush=True)
    ratio = longest[2] / longest[1] if longest[1] else float("nan")
    print(f"sp=2 / sp=1: {ratio:.2f}x the tokens per sequence (target >= 1.8x)")
    import torch
    import transformers

    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
              "transformers": transformers.__version__, "model": SHAPE, "dtype": "float32",
              "cap_mib_per_rank": args.cap_mib,
              "malloc_mmap_threshold": args.mmap_threshold or "glibc default", "resolution_tokens": args.resolution,
              "runs_per_length": REPEAT,
              "longest_tokens": {"sp1": longest[1], "sp2": longest[2]}, "sp2_over_sp1": round(ratio, 3),
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

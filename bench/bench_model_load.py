"""Peak memory of each trainer rank while the trainer builds its model: the sharded build's two paths
(rlkit.trainer.sharded_load: a meta skeleton filled either by rank 0's full CPU model broadcast into the shards,
"sharded", or by each rank's own rows of the checkpoint's safetensors, "slices") against today's (every rank builds
the whole model from the checkpoint, then FSDP2 shards it).

A wider Qwen2 than the tests' (hidden 1024, 4 layers, MLP 2816, vocabulary 8192, untied head: ~248 MB of float32
weights) is saved once as a Hugging Face directory; the actor's model factory (rlkit.trainer.engine.causal_lm,
gradient checkpointing on) builds it on 2 gloo ranks (the CPU standing in for the GPUs), fresh processes per variant
and repeat. A rank's cost is its peak resident memory over its resident memory just before the build (torch,
transformers' Qwen2 code and gloo warmed up first). The peak is the process's VmHWM, reset there: ru_maxrss would
start at this script's own size, which Linux carries into a child across exec. A variant's figure is the median of
--repeat runs of a rank's cost, for rank 1 and rank 0 (which alone builds the full model in "today" and "sharded";
in "slices" it holds its shards like any rank). The floor is the model's float32 bytes / world: one rank's shards,
what any sharded model must hold.

Run: `PYTHONPATH=. python bench/bench_model_load.py [--repeat 3]`; writes bench/results/cpu-model-load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from process_memory import image_peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402  (bench/, this script's own folder)

SHAPE = {"vocab_size": 8192, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2, "tie_word_embeddings": False}
WORLD = 2
MB = 1e6


def write_model(out: Path) -> int:
    """The bench's model, saved as a checkpoint; returns its float32 bytes."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, dtype="float32")).float()
    model.save_pretrained(out)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def child(variant: str, model_dir: str) -> dict[str, Any]:
    """One build on this rank (a fresh process); its peak over the resident memory just before."""
    import torch
    import torch.distributed as dist
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401  (imported before the measure)

    from rlkit.config.schema.actor import ActorConfig
    from rlkit.trainer.engine import causal_lm
    from rlkit.trainer.sharded_load import build_sharded, shard_model

    dist.init_process_group("gloo")
    device = torch.device("cpu")
    config = ActorConfig(path=model_dir, dtype="float32", attn_impl="sdpa", disable_dropout=True)
    warm = torch.zeros(1024)
    dist.broadcast(warm, src=0)  # gloo's first-use costs, paid before the measure
    dist.barrier()
    reset_peak_rss()
    before = rss_bytes()
    if variant in ("sharded", "slices"):  # the same build; "slices" is told the checkpoint its weights are
        model = build_sharded(lambda where: causal_lm(config, where), device, param_dtype=None,
                              checkpoint=model_dir if variant == "slices" else None)
    else:  # today's: the whole model on every rank, then sharded
        model = shard_model(causal_lm(config, device), param_dtype=None)
    dist.barrier()
    peak = image_peak_rss_bytes() - before
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    dist.destroy_process_group()
    return {"peak_over_start_bytes": peak, "local_shard_bytes": local}


def run_variant(variant: str, model_dir: Path) -> list[dict[str, Any]]:
    """Both ranks of one build, each in a fresh process; their results by rank."""
    from rlkit.servers.health import find_free_port

    port = str(find_free_port())
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", variant, str(model_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant}, rank {rank} failed:\n{err[-3000:]}")
        results.append(dict(json.loads(out.strip().splitlines()[-1])))
    return results


def main() -> int:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-model-load.json")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1])))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench-model-load-") as tmp:
        model_bytes = write_model(Path(tmp))
        runs = {variant: [run_variant(variant, Path(tmp)) for _ in range(args.repeat)]
                for variant in ("today", "sharded", "slices")}
    floor = model_bytes / WORLD
    summary: dict[str, Any] = {}
    for variant, repeats in runs.items():
        for rank in range(WORLD):
            peak = statistics.median(r[rank]["peak_over_start_bytes"] for r in repeats)
            summary[f"{variant}_rank{rank}_mb"] = round(peak / MB, 1)
            summary[f"{variant}_rank{rank}_over_floor"] = round(peak / floor, 2)
    summary["sharded_over_today_rank1"] = round(summary["sharded_rank1_mb"] / summary["today_rank1_mb"], 3)
    summary["slices_over_sharded_rank0"] = round(summary["slices_rank0_mb"] / summary["sharded_rank0_mb"], 3)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
              "transformers": transformers.__version__, "shape": SHAPE, "world": WORLD, "backend": "gloo",
              "model_float32_mb": round(model_bytes / MB, 1), "floor_mb": round(floor / MB, 1), "repeat": args.repeat,
              "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"model {model_bytes / MB:.0f} MB float32, floor (bytes / world {WORLD}) {floor / MB:.0f} MB")
    for variant in runs:
        print(f"{variant:8s} rank 1 peak {summary[f'{variant}_rank1_mb']:7.1f} MB = "
              f"{summary[f'{variant}_rank1_over_floor']:.2f}x the floor; "
              f"rank 0 {summary[f'{variant}_rank0_mb']:.1f} MB = {summary[f'{variant}_rank0_over_floor']:.2f}x")
    print(f"sharded / today (rank 1): {summary['sharded_over_today_rank1']:.3f}; "
          f"slices / sharded (rank 0): {summary['slices_over_sharded_rank0']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

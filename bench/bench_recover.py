"""Recover checkpoint save and load time against the floor of writing and reading the same bytes. Prints figures.

Run: `python bench/bench_recover.py`. One trainer rank (gloo, CPU) with a ~110 M-parameter Qwen2 in float32 and
AdamW states after one step (~1.3 GB in all):
  save   engine.save_sharded (one rank file, rlkit.trainer.rank_files, written front to back with its checksum
         computed on the way) + trainer state + manifest + fsync + rename
  load   latest_valid as the trainer's resume calls it (manifest, sizes, the small files' xxh3-128; the rank files'
         checksums left to their loader) + engine.load_sharded (the rank file read once straight into the model's
         and optimizer's tensors in 2 MiB blocks by one thread per core, each block hashed as it lands, the
         blocks' checksum checked against the manifest)
  floor  the same tensors written as one safetensors file with fsync, and every byte of it read back by one thread
Goals (issues 9 and 31): save <= 1.3x the floor write, load <= 1.3x the floor read. Measured on a 2-core shared
machine, four runs: save 0.83-1.08x, load 1.01-1.23x (one reading thread with a hashing thread behind it before:
1.31-1.55x; torch.distributed.checkpoint before that: 5.2x, its checksum pass alone 0.67x the read).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_grpo import build_medium_model  # noqa: E402
from floor_tensors import checkpoint_tensors  # noqa: E402

from rlkit.models.tiny import build_tiny_model  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402
from rlkit.trainer import block_read  # noqa: E402


def main() -> int:
    import torch
    from safetensors.torch import save_file

    from rlkit.config.schema.actor import ActorConfig
    from rlkit.trainer import recover
    from rlkit.trainer.actor import PPOActor
    from rlkit.trainer.dist import init_distributed
    from rlkit.types import Sample

    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-recover-", dir=os.environ.get("RLKIT_BENCH_DIR")) as tmp:
        work = Path(tmp)
        model = build_medium_model(build_tiny_model(work / "tiny"), work / "medium")
        _env, device = init_distributed()
        actor = ActorConfig(path=str(model), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                            group_size=2, ppo_n_minibatches=1)
        policy = PPOActor.build(actor, rank=0, world=1, device=device, pad_id=0, temperature=1.0,
                                total_optimizer_steps=10)
        engine = policy.engine
        samples = [Sample([5, 6, 7], [8, 9], [-5.0, -5.0], float(i), 0, True, 0, advantage=1.0 - 2 * i)
                   for i in range(2)]
        policy.train_step(samples, None, None)  # AdamW moments exist now
        flat = checkpoint_tensors(engine)
        size_mb = sum(t.numel() * t.element_size() for t in flat.values()) / 2**20
        root = recover.recover_root(work / "trial")
        root.mkdir(parents=True)
        saves, loads, checks, floor_w, floor_r = [], [], [], [], []
        for step in range(1, 4):
            path = work / "floor.safetensors"
            started = time.monotonic()
            save_file(flat, str(path))
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            floor_w.append(time.monotonic() - started)
            started = time.monotonic()
            with open(path, "rb") as f:  # every byte read (load_file alone maps the file lazily)
                while f.read(1 << 24):
                    pass
            floor_r.append(time.monotonic() - started)
            path.unlink()

            started = time.monotonic()
            tmp_dir = recover.temp_dir(root, step)
            digests = engine.save_sharded(recover.shards_dir(tmp_dir, "actor"))
            (tmp_dir / recover.STATE).write_text(recover.LoopState(step=step, engines={"actor": 1}).to_json())
            recover.seal(tmp_dir, recover.checkpoint_dir(root, step), digests)
            recover.prune(root, keep_last=1)
            saves.append(time.monotonic() - started)
            started = time.monotonic()
            found = recover.latest_valid(root, defer_rank_files=True)  # as the trainer's resume does
            assert found is not None and found[0] == step
            verified = time.monotonic()
            engine.load_sharded(recover.shards_dir(found[1], "actor"), optimizer_steps=1,
                                expected=recover.manifest_digests(found[1]))
            loads.append(time.monotonic() - started)
            checks.append(verified - started)
        save, load, check = statistics.median(saves), statistics.median(loads), statistics.median(checks)
        fw, fr = statistics.median(floor_w), statistics.median(floor_r)
        print(f"recover checkpoint, model + AdamW {size_mb:.0f} MB, median of 3: save {save:.2f} s vs floor write "
              f"{fw:.2f} s ({save / fw:.2f}x, goal <= 1.3x); load {load:.2f} s vs floor read {fr:.2f} s "
              f"({load / fr:.2f}x, goal <= 1.3x), of which latest_valid {check:.2f} s and the rank file's read with "
              f"its checksum on {block_read.reader_threads()} threads {load - check:.2f} s", flush=True)
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much of the model one training step changes: the measurement behind issue 31's delta-sync decision.

Trains the CPU demo's tiny model (rlkit.models.tiny, float32 master weights) with rlkit's own TrainEngine (AdamW
with the actor's defaults, one gloo rank) for `--steps` steps at each learning rate of `--lr` (the CPU demo's 3e-3,
the GPU configs' 1e-6), and after every step compares the weights the servers would receive with the previous
version's, as float32 (the CPU demo's wire dtype) and as bfloat16 (the GPU configs'):
  changed     the fraction of elements whose value differs
  sparse      bytes of a (4-byte index, value) list of the changed elements, / the full model's bytes
  xor+zlib    bytes of zlib level 1 over the XOR of the two versions' bits, / the full model's bytes (and zlib's
              speed on one core: a compressor slower than the link costs more than it saves)
  rlkit push  bytes of the push rlkit sends with `actor.weight_update_delta` (rlkit.weights.delta.DeltaEncoder: per
              tensor the (index, value) list, or the whole tensor where that is not smaller), / the full model's bytes
A delta pays where `sparse` or `xor+zlib` is well below 1; the full push costs 1. Prints one line per (lr, dtype)
with the median over the steps; asserts nothing.

Run: `PYTHONPATH=. python bench/bench_delta.py [--steps 5] [--lr 3e-3 1e-6]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def weights(engine: object) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(engine.model)  # type: ignore[attr-defined]
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().clone() for k, v in state.items()}


def compare(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], dtype: torch.dtype
            ) -> tuple[float, float, float, float]:
    """(changed fraction, sparse bytes / full bytes, xor+zlib bytes / full bytes, zlib's MB/s on one core) of
    `after` against `before`."""
    changed = total = xor_bytes = 0
    zlib_seconds = 0.0
    width = torch.tensor([], dtype=dtype).element_size()
    as_int = {2: torch.int16, 4: torch.int32}[width]
    for name, old in before.items():
        a, b = old.to(dtype).view(as_int), after[name].to(dtype).view(as_int)
        changed += int((a != b).sum())
        total += a.numel()
        raw = (a ^ b).numpy().tobytes()
        started = time.perf_counter()
        xor_bytes += len(zlib.compress(raw, 1))
        zlib_seconds += time.perf_counter() - started
    full = total * width
    return changed / total, changed * (4 + width) / full, xor_bytes / full, full / 1e6 / zlib_seconds


class PushMeter:
    """rlkit's own encoder for one wire dtype, pushing every version to one server that always holds the last."""

    def __init__(self, dtype: torch.dtype) -> None:
        from rlkit.servers.backend import Server
        from rlkit.weights.delta import DeltaEncoder

        self.encoder, self.itemsize = DeltaEncoder(dtype), dtype.itemsize
        self.servers = [Server(index=0, address="bench:0", model="m", backend="vllm")]

    def push(self, state: dict[str, torch.Tensor]) -> float:
        """The push's bytes / the full model's bytes in the wire dtype."""
        from rlkit.weights.base import ServerOutcome, ServerSync

        self.encoder.header(self.servers)
        sent = sum(t.nbytes for t in self.encoder.encode_bucket(state).values())
        self.encoder.complete()
        self.encoder.settle([ServerOutcome(self.servers[0], sync=ServerSync(index=0, address="bench:0", version=0))])
        return sent / sum(t.numel() * self.itemsize for t in state.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, nargs="+", default=[3e-3, 1e-6])
    args = parser.parse_args()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    from rlkit.config.schema.actor import ActorConfig
    from rlkit.models.tiny import build_tiny_model
    from rlkit.trainer.dist import init_distributed
    from rlkit.trainer.engine import TrainEngine

    env, device = init_distributed()
    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-delta-")) / "model")
    generator = torch.Generator().manual_seed(0)

    def loss_fn(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)), 1

    print(f"{'lr':>8} {'dtype':>9} {'changed':>8} {'sparse':>8} {'xor+zlib':>9} {'zlib MB/s':>10} {'rlkit push':>11}"
          f"  (medians over {args.steps} steps)")
    for lr in args.lr:
        config = ActorConfig(path=str(model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa")
        config.optimizer.lr = lr
        engine = TrainEngine(config, rank=env.rank, world=env.world_size, device=device,
                             total_optimizer_steps=args.steps)
        rows: dict[str, list[tuple[float, float, float, float, float]]] = {"float32": [], "bfloat16": []}
        previous = weights(engine)
        meters = {"float32": PushMeter(torch.float32), "bfloat16": PushMeter(torch.bfloat16)}
        for meter in meters.values():
            meter.push(previous)  # the first push is full
        for _ in range(args.steps):
            batch = torch.randint(0, 500, (4, 32), generator=generator)
            engine.optimizer_step([batch], loss_fn, 1.0)
            current = weights(engine)
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
                rows[name].append((*compare(previous, current, dtype), meters[name].push(current)))
            previous = current
        for name, figures in rows.items():
            changed, sparse, packed, speed, pushed = (statistics.median(column) for column in zip(*figures,
                                                                                                 strict=True))
            print(f"{lr:>8.0e} {name:>9} {changed:>8.1%} {sparse:>8.3f} {packed:>9.3f} {speed:>10.0f} {pushed:>11.3f}",
                  flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

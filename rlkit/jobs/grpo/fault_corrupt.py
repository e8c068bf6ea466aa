"""Fault injection for the log-probability mismatch test: one server silently serves other weights.

RLKIT_FAULT_INJECT=corrupt_server_weights@<k> (first attempt only, rlkit.slurm.faults): right after the push of
version k passed its version and fingerprint checks, and before any request of version k is admitted, trainer rank 0
loads a perturbed copy of version k into server 1 through the same worker route a disk push uses (`/collective_rpc
rlkit_reload_weights`) but without `/update_weight_version`: the server still reports version k. Nothing but the
per-step log-prob mismatch (rlkit.trainer.mismatch) can see it; the next push repairs it. Never used in normal runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rlkit.jobs.grpo.rank0 import Rank0

FAULT = "corrupt_server_weights"
VICTIM = 1  # the server index that gets the perturbed weights
# Gaussian noise added to every floating tensor, in units of that tensor's std: on the CPU demo's tiny model 0.2 moved
# the rollout log-probs by 0.04 on average (float32 agreement is ~1e-7), 0.5 gives a margin over the 1e-2 warning
NOISE = 0.5


def perturbed(state: dict[str, torch.Tensor], aliases: dict[str, str], seed: int = 0) -> dict[str, torch.Tensor]:
    """A copy of `state` with seeded noise of NOISE x each floating tensor's std; tied aliases (`{alias: canonical}`,
    rlkit.weights.hf_export.tied_weight_aliases) get their canonical tensor's new value, so the tie holds."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if name in aliases and aliases[name] in state:
            continue
        if value.is_floating_point() and value.numel() > 1:
            noise = torch.randn(value.shape, generator=gen, dtype=torch.float32).to(value.dtype)
            out[name] = value + noise * NOISE * value.float().std().to(value.dtype)
        else:
            out[name] = value
    for alias, canonical in aliases.items():
        if alias in state and canonical in out:
            out[alias] = out[canonical]
    return out


def corrupt_server(trainer: Rank0, state: dict[str, Any], version: int) -> None:
    """Rank 0: load a perturbed copy of `state` into server VICTIM, keeping its reported version `version` (the
    backend's own disk load, told the version it already has)."""
    from rlkit.models.dtypes import DTYPES
    from rlkit.servers.backend import backend_for
    from rlkit.servers.http import server_client
    from rlkit.weights import hf_export
    from rlkit.weights.base import deliver_in_sequence

    servers = [s for s in trainer.controller.servers if s.index == VICTIM]
    if not servers:
        print(f"rlkit train: fault {FAULT}@{version}: no server {VICTIM} to corrupt", flush=True)
        return
    server = servers[0]
    out_dir = Path(trainer.paths.weights) / f"{FAULT}-v{version}"
    shutil.rmtree(out_dir, ignore_errors=True)
    model_dir = Path(trainer.config.actor.path)
    noisy = perturbed(state, hf_export.tied_weight_aliases(model_dir), seed=version)
    hf_export.write_weights(noisy, model_dir, out_dir, dtype=DTYPES[trainer.config.actor.dtype])
    timeout = trainer.config.rollout.request_timeout
    backend = backend_for(server.backend)

    async def reload() -> None:
        async with server_client(trainer.token) as client:
            await deliver_in_sequence(client, backend, server, timeout, {}, lambda: backend.load_weights_from_disk(
                client, server, out_dir.absolute(), version, timeout))

    try:
        trainer.controller.run(reload, timeout=3 * timeout + 60, what=f"fault {FAULT}@{version}: loading perturbed "
                               f"weights on {server.label}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    print(f"rlkit train: fault injected: {FAULT}@{version}: {server.label} now serves perturbed "
          f"weights and still reports version {version}", flush=True)

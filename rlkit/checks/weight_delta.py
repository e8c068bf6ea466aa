"""Submit-time check of `actor.weight_update_delta`: where a delta push has a receiver. Torch-free.

Only rlkit's own receive paths apply a delta (rlkit.servers.weight_delta): vLLM's worker extension (disk) and rlkit's
gloo engine (broadcast on CPU servers; on GPUs vLLM's NCCL engine receives, and the trainer refuses a delta there when
it starts). SGLang loads whole checkpoints through its own routes, and LoRA runs push adapters, not weights.
"""

from __future__ import annotations

from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig


def validate_weight_delta(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """Add a problem for each thing that keeps `actor.weight_update_delta` from reaching the servers."""
    actor = config.actor
    if not actor.weight_update_delta:
        return
    if actor.use_lora:
        problems.add("actor.weight_update_delta with actor.use_lora: a LoRA run pushes its adapters (small "
                     "directories), never the weights a delta applies to",
                     hint="set actor.weight_update_delta: false")
    server = allocation.server if allocation is not None else None
    if server is not None and server.backend != "vllm":
        problems.add(f"actor.weight_update_delta with {server.backend} servers (allocation_mode "
                     f"{config.allocation_mode!r}): only vLLM servers apply deltas (rlkit's worker extension and "
                     "gloo engine); the others load whole checkpoints through their own routes",
                     hint="serve with vLLM, or set actor.weight_update_delta: false")

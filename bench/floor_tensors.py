"""The tensors a recover checkpoint holds, as one flat dict on the CPU: what the benches write and read back as
their disk floor (bench_recover.py on the CPU, bench_gpu.py on a GPU). Needs only torch, so it runs where vLLM and
the test helpers are not installed."""

from __future__ import annotations

from typing import Any


def checkpoint_tensors(engine: Any) -> dict[str, Any]:
    """The engine's model and AdamW states (full tensors, each storage once: a tied head is one tensor under two
    names, written once as the checkpoint does), detached, contiguous, on the CPU."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    flat = {f"model.{k}": v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model_sd.items()}
    for pid, entry in optim_sd["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                flat[f"optim.{pid}.{name}"] = value.full_tensor() if hasattr(value, "full_tensor") else value
    seen: set[int] = set()
    return {k: v.detach().contiguous().cpu() for k, v in flat.items()
            if not (v.data_ptr() in seen or seen.add(v.data_ptr()))}

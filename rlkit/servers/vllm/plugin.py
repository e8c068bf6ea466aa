"""rlkit's vLLM general plugin (entry point group `vllm.general_plugins`, declared in pyproject.toml): registers the
`gloo` weight-transfer backend, so `--weight-transfer-config '{"backend": "gloo"}'` runs vLLM's own broadcast protocol
(`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`) over gloo on
the CPU, exactly as the built-in `nccl` backend runs it on GPUs.

vLLM calls `register` in every process it starts (API server, engine core, workers). Registration is by module and
class name, so nothing here imports torch or vLLM's weight-transfer code until a server asks for the backend.
"""

from __future__ import annotations

GLOO_BACKEND = "gloo"
GLOO_ENGINE_MODULE = "rlkit.servers.vllm.gloo_engine"
GLOO_ENGINE_CLASS = "GlooWeightTransferEngine"


def register() -> None:
    """Add the gloo engine to vLLM's weight-transfer factory (idempotent: vLLM may call plugins more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, GLOO_ENGINE_MODULE, GLOO_ENGINE_CLASS)

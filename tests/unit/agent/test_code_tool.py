"""The code tool's barriers, each shown holding on this machine with real processes: the code tries the thing the
barrier forbids (by plain Python, which the audit hook stops, and through ctypes, which only the kernel stops),
and the test looks at the outcome from outside (its own listeners, /proc, the parent's memory)."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.agent.code_tool import CodeLimits, CodeResult, CodeTool, code_limit_problems, run_python
from rlkit.agent.sandbox_child import NETWORK_MESSAGE

SLACK = 1.0  # seconds past a wall-clock limit for the parent to wake, kill and reap on a busy 2-core machine
CTYPES_CONNECT = """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
def raw_connect(kind, port, payload=b""):
    fd = libc.socket(socket.AF_INET, kind, 0)  # the kernel's socket(2), past the audit hook
    if fd < 0:
        return fd, ctypes.get_errno()
    addr = struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton("127.0.0.1") + bytes(8)
    if kind == socket.SOCK_DGRAM:
        rc = libc.sendto(fd, payload, len(payload), 0, addr, len(addr))
    else:
        rc = libc.connect(fd, addr, len(addr))
    return rc, ctypes.get_errno()
"""


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    """A root every user can traverse (pytest's tmp_path is under a 0700 directory and the code may run as
    nobody)."""
    root = Path(tempfile.mkdtemp(prefix="rlkit-code-test-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run(code: str, scratch_root: Path, **limits: float) -> CodeResult:
    return run_python(code, limits=CodeLimits(**limits), scratch_root=scratch_root)  # type: ignore[arg-type]


def processes_with(marker: str, where: str = "environ") -> list[int]:
    """Every process whose initial environment (or, with where="cmdline", command line) holds `marker`. A run's
    processes are found by their environment, which names the run's scratch directory under the test's own
    scratch root (HOME, TMPDIR): the code is never in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / where).read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_watching(code: str, scratch_root: Path, **limits: float) -> tuple[CodeResult, bool]:
    """Run in a thread and report whether the run's processes were seen alive (so an empty scan after the run
    means they were killed, not that the scan cannot see them)."""
    results: list[CodeResult] = []
    worker = threading.Thread(target=lambda: results.append(run(code, scratch_root, **limits)))
    worker.start()
    seen = False
    while worker.is_alive():
        seen = seen or bool(processes_with(str(scratch_root)))
        time.sleep(0.05)
    worker.join()
    return results[0], seen


def assert_isolated(result: CodeResult) -> None:
    assert not any("namespaces" in note for note in result.notes), result.notes


def test_a_normal_snippet_prints_its_result(scratch_root: Path) -> None:
    result = run("import math\nprint(sum(i * i for i in range(10)), math.factorial(5))", scratch_root)
    assert result.ok and result.error is None and result.killed_by is None
    assert result.output == "285 120\n"
    assert result.tool_text() == "285 120\n"
    assert_isolated(result)


def test_an_exception_is_a_readable_error_not_a_crash(scratch_root: Path) -> None:
    result = run("print('before')\n1 / 0", scratch_root)
    assert not result.ok and result.killed_by is None
    assert result.error == "the program exited with status 1: ZeroDivisionError: division by zero"
    assert result.output.startswith("before\nTraceback")
    assert result.tool_text().endswith("[the program exited with status 1: ZeroDivisionError: division by zero]")


def test_an_infinite_loop_ends_at_the_wall_limit_and_leaves_no_process(scratch_root: Path) -> None:
    marker = f"loop-{uuid.uuid4().hex}"
    result, seen = run_watching(f"# {marker}\nwhile True:\n    pass", scratch_root, wall_seconds=1.0)
    assert result.killed_by == "time" and not result.ok
    assert result.error == "time limit of 1 s exceeded; the program was stopped"
    assert 1.0 <= result.seconds <= 1.0 + SLACK
    assert seen and processes_with(str(scratch_root)) == []


def test_code_that_leaves_the_process_group_still_dies_with_the_run(scratch_root: Path) -> None:
    """killpg misses the code (it runs in a session of its own, so that kill(0, ...) cannot reach its supervisor),
    and code can clear its parent-death signal; the end of its pid namespace still takes it."""
    marker = f"setsid-{uuid.uuid4().hex}"
    code = (f"# {marker}\nimport ctypes, os, time\nassert os.getsid(0) == os.getpid()\n"
            "ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\nprint('left the group', flush=True)\ntime.sleep(60)")
    result, seen = run_watching(code, scratch_root, wall_seconds=1.0)
    assert result.killed_by == "time" and "left the group" in result.output
    assert seen and processes_with(str(scratch_root)) == []


def test_a_busy_loop_ends_at_the_cpu_limit(scratch_root: Path) -> None:
    # a wall-clock limit far past the CPU limit: with the whole suite on two cores, 10 s of wall time once gave the
    # loop less than its 1 CPU-s, and the wall limit stopped it first
    result = run("while True:\n    pass", scratch_root, cpu_seconds=1, wall_seconds=120.0)
    assert result.killed_by == "cpu"
    assert result.error == "CPU time limit of 1 s exceeded; the program was stopped"
    assert result.cpu_seconds is not None and result.cpu_seconds <= 2.0  # at most the hard limit
    assert result.seconds < 120.0  # SIGXCPU ended it, not the wall-clock limit


def test_a_memory_bomb_ends_as_a_memory_error_within_its_limit(scratch_root: Path) -> None:
    code = "chunks = []\nfor _ in range(16):\n    chunks.append(b'x' * (64 << 20))\nprint('allocated 1 GB')"
    result = run(code, scratch_root, memory_mb=128)
    assert result.killed_by == "memory" and not result.ok
    assert result.error == "memory limit of 128 MB exceeded"
    assert "allocated" not in result.output
    assert result.max_rss_mb is not None and result.max_rss_mb <= 128
    assert result.seconds < 5


FORKS = {
    "os.fork": "import os\nif os.fork() == 0:\n    print('CHILD-RAN', flush=True)\n    time.sleep(60)",
    "subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'echo CHILD-RAN; sleep 60'])",
    "multiprocessing": "import multiprocessing\np = multiprocessing.Process(target=lambda: (print('CHILD-RAN', "
    "flush=True), time.sleep(60)))\np.start()\np.join()",
    "ctypes fork": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\npid = libc.fork()\nif pid == 0:\n"
    "    print('CHILD-RAN', flush=True)\n    time.sleep(60)\nprint('fork returned', pid, ctypes.get_errno())",
}


@pytest.mark.parametrize("how", sorted(FORKS))
def test_a_fork_attempt_fails_and_no_child_outlives_the_tool(scratch_root: Path, how: str) -> None:
    marker = f"fork-{uuid.uuid4().hex}"
    result = run(f"# {marker}\nimport time\n{FORKS[how]}", scratch_root, wall_seconds=5.0)
    assert "CHILD-RAN" not in result.output
    assert result.killed_by is None
    if how == "ctypes fork":  # past the audit hook: the kernel's RLIMIT_NPROC says no (EAGAIN)
        assert "fork returned -1 11" in result.output
    else:
        assert result.error is not None and "starting processes is not allowed in the code tool" in result.error
    assert processes_with(str(scratch_root)) == []


def test_threads_cannot_be_started_either(scratch_root: Path) -> None:
    result = run("import threading\nthreading.Thread(target=print).start()", scratch_root)
    assert result.error == "the program exited with status 1: RuntimeError: can't start new thread"


def test_a_huge_output_is_truncated_at_the_cap_quickly_with_bounded_parent_memory(scratch_root: Path) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))"  # 100 MB
    tracemalloc.start()
    try:
        result = run(code, scratch_root, output_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.killed_by == "output"
    assert result.error == "output truncated at 4096 bytes; the program was stopped"
    assert result.output == "x" * 4096
    # stopped at the cap, long before the wall-clock limit (under 1 s idle; 2.5 s once with the whole suite on 2 cores)
    assert result.seconds < CodeLimits().wall_seconds / 2
    assert peak < 4 << 20  # the parent kept the cap, not the flood


def test_output_of_stdout_and_stderr_arrives_interleaved_in_order(scratch_root: Path) -> None:
    result = run("import sys\nprint('out 1')\nprint('err 2', file=sys.stderr)\nprint('out 3')", scratch_root)
    assert result.output == "out 1\nerr 2\nout 3\n"


@pytest.fixture
def listeners() -> Iterator[tuple[socket.socket, socket.socket]]:
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for sock in (tcp, udp):
        sock.settimeout(0.3)
    yield tcp, udp
    tcp.close()
    udp.close()


def nothing_arrived(tcp: socket.socket, udp: socket.socket) -> bool:
    try:
        tcp.accept()[0].close()
        return False
    except TimeoutError:
        pass
    try:
        udp.recvfrom(512)
        return False
    except TimeoutError:
        return True


def test_the_network_is_not_reachable(scratch_root: Path, listeners: tuple[socket.socket, socket.socket]) -> None:
    tcp, udp = listeners
    tcp_port, udp_port = tcp.getsockname()[1], udp.getsockname()[1]
    code = CTYPES_CONNECT + f"""
print("tcp", *raw_connect(socket.SOCK_STREAM, {tcp_port}))
print("udp", *raw_connect(socket.SOCK_DGRAM, {udp_port}, b"dns-like query"))
res = ctypes.c_void_p()
print("resolve", libc.getaddrinfo(b"pypi.org", None, None, ctypes.byref(res)) != 0)
socket.create_connection(("127.0.0.1", {tcp_port}), timeout=1)
"""
    result = run(code, scratch_root)
    assert_isolated(result)
    lines = result.output.splitlines()
    assert lines[0] == "tcp -1 1" and lines[1] == "udp -1 1"  # the kernel said no: EPERM (seccomp) at socket(2)
    assert lines[2] == "resolve True"  # the name lookup failed (no DNS server is reachable)
    assert result.error == f"the program exited with status 1: PermissionError: {NETWORK_MESSAGE}"
    assert nothing_arrived(tcp, udp)


def test_without_namespaces_the_audit_hook_still_stops_plain_sockets_and_the_result_says_so(
    scratch_root: Path, listeners: tuple[socket.socket, socket.socket]
) -> None:
    """The fallback layer (isolation: best_effort): the audit hook's readable error for plain Python, and the
    seccomp filter's EPERM for code that calls socket(2) through ctypes, without any namespace."""
    tcp, _ = listeners
    port = tcp.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
    loose = {"namespaces": False, "isolation": "best_effort"}
    result = run_python(code, limits=CodeLimits(), scratch_root=scratch_root, **loose)
    assert "network is not available in the code tool" in (result.error or "")
    assert any("no namespaces (turned off)" in note for note in result.notes)
    bypass = CTYPES_CONNECT + f"print('tcp', *raw_connect(socket.SOCK_STREAM, {port}))"
    result = run_python(bypass, limits=CodeLimits(), scratch_root=scratch_root, **loose)
    assert result.output == "tcp -1 1\n", result.output
    assert nothing_arrived(tcp, listeners[1])
    forked = run_python(FORKS["ctypes fork"], limits=CodeLimits(), scratch_root=scratch_root, **loose)
    assert "fork returned -1 11" in forked.output  # RLIMIT_NPROC holds without namespaces too


def test_the_cwd_is_a_fresh_scratch_directory_removed_afterwards(scratch_root: Path) -> None:
    code = "import os\nprint(os.getcwd())\nprint(os.listdir('.'))\nopen('notes.txt', 'w').write('kept?')"
    first = run(code, scratch_root)
    second = run(code, scratch_root)
    cwd_1, listing_1 = first.output.splitlines()
    cwd_2, listing_2 = second.output.splitlines()
    assert first.ok and second.ok
    # each run's own directory, seen at the path of the one that holds every run's (which it covers)
    assert Path(cwd_1) == Path(cwd_2) == scratch_root
    assert listing_1 == listing_2 == "[]"  # fresh: the first run's notes.txt is not in the second's
    assert list(scratch_root.iterdir()) == []


def test_a_file_over_the_size_limit_fails_to_write(scratch_root: Path) -> None:
    result = run("open('big', 'wb').write(b'x' * (3 << 20))", scratch_root, file_mb=1)
    assert result.error is not None and "File too large" in result.error
    assert list(scratch_root.iterdir()) == []


def test_parent_secrets_and_python_settings_do_not_reach_the_code(
    scratch_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "planted.py").write_text("print('PLANTED')")
    for name in ("RLKIT_SERVER_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "s3cr3t-value")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "planted.py"))
    code = """import os, sys
print(sorted(os.environ))
print(sys.flags.isolated, sys.flags.no_user_site)
seen = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            seen.append(open(f'/proc/{pid}/environ', 'rb').read())
        except OSError:
            pass
print(any(b's3cr3t' in text for text in seen), len(seen))
import planted
"""
    result = run(code, scratch_root)
    assert "s3cr3t" not in result.output and "PLANTED" not in result.output
    names, flags, proc_scan = result.output.splitlines()[:3]
    assert names == "['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', 'TMPDIR']"
    assert flags == "1 1"
    assert proc_scan.startswith("False ")
    assert result.error == "the program exited with status 1: ModuleNotFoundError: No module named 'planted'"


def test_the_code_sees_only_its_own_processes(scratch_root: Path) -> None:
    result = run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", scratch_root)
    assert result.output == "[1, 2]\n"  # the guard and the runner: a private /proc of a private pid namespace


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("print(1)\0", "the code must be UTF-8 text without NUL characters"),
        ("print('\ud800')", "the code must be UTF-8 text without NUL characters"),
        ("x = 1\n" * 40_000, "the code is too long for the code tool (at most about 100 KB)"),
    ],
)
def test_code_that_cannot_be_passed_on_is_a_result(scratch_root: Path, code: str, error: str) -> None:
    result = run(code, scratch_root)
    assert (result.ok, result.error) == (False, error)
    assert list(scratch_root.iterdir()) == []


def test_many_concurrent_runs_through_the_async_api_all_finish_at_most_max_concurrent_at_once(
    scratch_root: Path,
) -> None:
    # runs of 0.8 s: long beside a sandbox's start on a loaded machine, so that runs admitted together overlap
    code = "import time\nstart = time.monotonic()\ntime.sleep(0.8)\nprint({i} ** 2, start, time.monotonic())"

    async def main() -> list[CodeResult]:
        tool = CodeTool(CodeLimits(max_concurrent=3), scratch_root)
        try:
            return await asyncio.gather(*(tool.run(code.format(i=i)) for i in range(10)))
        finally:
            tool.close()

    results = asyncio.run(main())
    assert all(r.ok for r in results)
    rows = [r.output.split() for r in results]
    assert [int(row[0]) for row in rows] == [i**2 for i in range(10)]
    spans = [(float(row[1]), float(row[2])) for row in rows]  # CLOCK_MONOTONIC is the same in every namespace
    at_once = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert 2 <= at_once <= 3


def test_the_rollout_goes_on_after_each_kind_of_failure(scratch_root: Path) -> None:
    failures = {
        "time": "while True:\n    pass",
        "memory": "x = b'x' * (1 << 30)",
        "output": "while True:\n    print('y' * 1000)",
        "fork": "import os\nos.fork()",
        "network": "import socket\nsocket.getaddrinfo('pypi.org', 443)",
    }

    async def main() -> list[tuple[CodeResult, CodeResult]]:
        # 3 s of wall time: a sandbox's start alone took over 1 s beside the suite's load (the good run failed)
        tool = CodeTool(CodeLimits(wall_seconds=3.0, memory_mb=128, output_bytes=1024, max_concurrent=2),
                        scratch_root)
        try:
            pairs = []
            for code in failures.values():
                pairs.append((await tool.run(code), await tool.run("print('still here')")))
            return pairs
        finally:
            tool.close()

    for (bad, good), kind in zip(asyncio.run(main()), failures, strict=True):
        assert not bad.ok and bad.error, kind
        assert good.ok and good.output == "still here\n", kind


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({}, []),
        ({"wall_seconds": 0}, ["wall_seconds"]),
        ({"wall_seconds": math.nan, "cpu_seconds": "10"}, ["wall_seconds", "cpu_seconds"]),
        (
            {"memory_mb": True, "output_bytes": 10**9, "max_concurrent": 0},
            ["memory_mb", "output_bytes", "max_concurrent"],
        ),
        ({"file_mb": 2.5}, ["file_mb"]),
    ],
)
def test_limit_problems_name_every_bad_field_with_a_fix(changes: dict[str, object], fields: list[str]) -> None:
    problems = code_limit_problems(CodeLimits(**changes))  # type: ignore[arg-type]
    assert [field for field, _, _ in problems] == fields
    for _, message, fix in problems:
        assert message.startswith("is ") and fix.startswith("set it")


def test_misconfigured_limits_are_a_result_not_an_exception(scratch_root: Path) -> None:
    result = run("print(1)", scratch_root, wall_seconds=-1)
    assert not result.ok and result.error is not None and "wall_seconds is -1" in result.error


def test_the_code_can_write_only_in_its_scratch_directory_and_cannot_see_hidden_paths(scratch_root: Path) -> None:
    """The trial's checkpoints, the reward module, the user's dotfiles: nothing outside the scratch directory is
    writable, even a directory every user may write in; and the paths rlkit hides (secrets, the trial directory,
    the training data) show nothing, even when their files are readable by everyone."""
    shared = Path(tempfile.mkdtemp(prefix="rlkit-code-test-shared-"))
    secret_dir = Path(tempfile.mkdtemp(prefix="rlkit-code-test-secret-"))
    secret_file = Path(tempfile.mkstemp(prefix="rlkit-code-test-netrc-")[1])
    try:
        for path in (shared, secret_dir):
            path.chmod(0o777)
        (secret_dir / "token").write_text("s3cret")
        (secret_dir / "token").chmod(0o644)
        secret_file.write_text("machine x password s3cret")
        secret_file.chmod(0o644)
        code = (
            "import os\n"
            f"try:\n    open({str(shared / 'planted')!r}, 'w').write('x')\n    print('WROTE-OUTSIDE')\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
            "open('mine.txt', 'w').write('ok')\nprint('scratch', open('mine.txt').read())\n"
            f"print('listing', os.listdir({str(secret_dir)!r}))\n"
            f"print('file', repr(open({str(secret_file)!r}).read()))\n"
        )
        result = run_python(code, limits=CodeLimits(), scratch_root=scratch_root, hide=[str(secret_dir),
                                                                                       str(secret_file)])
        assert_isolated(result)
        assert result.ok, result
        assert "WROTE-OUTSIDE" not in result.output and "refused 30" in result.output, result.output  # EROFS
        assert "scratch ok" in result.output and "listing []" in result.output and "file ''" in result.output
        assert "s3cret" not in result.output and not (shared / "planted").exists()
        kept = run_python("print(1)", limits=CodeLimits(), scratch_root=scratch_root, hide=[str(scratch_root)])
        assert not kept.ok and "is what the run needs" in (kept.error or ""), kept  # cannot be hidden: refused
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)
        secret_file.unlink(missing_ok=True)

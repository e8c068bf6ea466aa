"""The built-in Python code tool: model-written code in a separate, killable, limited process.

Hard barriers (the kernel enforces them; the tests check each one on this machine):
- time: the parent SIGKILLs the child's whole process group at the wall-clock limit; RLIMIT_CPU ends a busy
  loop at the CPU limit. The code runs inside a new pid namespace whose init (the guard) dies with the
  supervisor, so no process of the run outlives it, not even one that left the process group.
- memory: RLIMIT_DATA at memory_mb: CPython's heap (brk, pymalloc arenas, large malloc mmaps) is private
  writable memory, which RLIMIT_DATA counts; allocations past it fail and Python raises MemoryError. RLIMIT_DATA
  does not count shared mappings (a MAP_SHARED anonymous mmap, a mapped memfd), so RLIMIT_AS also bounds the whole
  address space at memory_mb + 256 MB (the interpreter and its libraries: bare python ~14 MB, numpy ~170 MB): a
  shared-mapping bomb fails at its mmap and ends as a tool error.
- processes: RLIMIT_NPROC=1, held by a non-root user: when rlkit runs as root the code runs as `nobody` (the
  kernel exempts uid 0 from RLIMIT_NPROC), and the count is the one of its own new user namespace, so other
  users' and other runs' processes do not matter. Threads count too: the code runs single-threaded.
- network: a new network namespace with only a loopback that is down; nothing outside is reachable.
- sockets and the kernel's attack surface: a seccomp filter (the guard installs it after PR_SET_NO_NEW_PRIVS, so
  with or without namespaces; the code inherits it) denies every socket (so no network and no local service, also
  one bound after the run began), io_uring, ptrace, the mount, namespace and keyring calls, bpf, perf_event_open and
  userfaultfd, and the kernel objects no limit counts and the channels to host objects (System V IPC, memfd_secret,
  xattrs, locks, inotify, TIOCSTI: rlkit.agent.sandbox_seccomp's docstring); under `required` a run without it
  never starts. Landlock and a minimal /dev close host FIFOs, device nodes and ptys (rlkit.agent.sandbox_mounts);
  without Landlock, nodev mounts and the guard's check of each open for writing do (rlkit.agent.sandbox_opens).
- signals: the code can signal only itself and its own process group (a second seccomp filter; Landlock ABI 6's
  signal scope too), also without a pid namespace, where the job user's other processes are the same user's.
- output: stdout and stderr share one pipe read by the parent; one byte past the cap stops the run.
- files: in the run's own mount namespace every mount is read-only but the scratch directory, and the paths the
  caller hides (the rollout hides the trials, rlkit's home, the training data and the usual places of the user's
  credentials: rlkit.rollout.agent_setup.hidden_from_code) are covered by an empty tmpfs (or /dev/null for a file).
- privileges: PR_SET_NO_NEW_PRIVS, a fresh interpreter after the namespaces (no capabilities), `python -I`
  (no user site, no PYTHON* variables), a minimal environment (no inherited variables at all), /proc showing
  the sandbox's processes only, a fresh scratch directory as cwd: a tmpfs of `scratch_mb` (all the run's files
  together), gone with the run, and the only one the run sees (it is mounted over the directory that holds every
  run's: concurrent runs of one user cannot read each other's files); RLIMIT_FSIZE per file; no memfd at all.
- the code itself reaches the sandbox through memfds, never argv (which `ps` shows to every local user).

Best effort (a second layer or a readable message, not a barrier): an audit hook raises PermissionError with a
readable text on sockets and process creation (code using ctypes bypasses it; the kernel barriers then hold).

- local services: every listening unix socket of the node's /proc/net/unix is also covered with /dev/null in the
  run's mount namespace (a read-only mount does not stop connect), abstract sockets stay in the old network
  namespace;
  the guard joins a fresh session keyring, so the trainer's keys (Kerberos/AFS tokens) and an earlier run's are out
  of reach.

Not covered: files outside the hidden paths stay readable as far as the code's user may read them (as `nobody`
when rlkit runs as root, otherwise as the job's own user). Without namespaces (best effort) the scratch directory
is the host directory (its total is capped per file only) and concurrent runs, all of one user, can read each
other's scratch files.

Namespaces need unprivileged user namespaces (Linux >= 3.8, `user.max_user_namespaces` > 0; Debian's
`kernel.unprivileged_userns_clone=1`; Ubuntu 24.04's `kernel.apparmor_restrict_unprivileged_userns=0`); the
mounts are made read-only with one recursive mount_setattr (Linux >= 5.12), before 5.12 with a remount of each
mount (keeping the flags a user namespace locks). Fail closed by default (`isolation: required`): where the namespaces
cannot be created, /proc cannot be made private, a mount cannot be made read-only or a path cannot be hidden, the
code is not run and the call is a tool error naming what did not hold; the trainer says at start what the node
gives (rlkit.agent.python_tool.isolation_summary). With `isolation: best_effort` such a run goes on with
what holds and `CodeResult.notes` says what did not (printed once in the trainer's log): without namespaces the
network is then blocked by the audit hook only, /proc shows the node's processes, and the file system is
neither read-only nor hidden.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from rlkit.agent.sandbox import ChildRun, ChildSpec, fits_in_argument, run_child
from rlkit.agent.sandbox_child import MEMORY_EXIT
from rlkit.agent.sandbox_paths import CannotHide, hidden_paths, needed_by_run

SYSTEM_PYTHON = "/usr/bin/python3"
ISOLATION_LEVELS = ("required", "best_effort")  # rollout.agent.code_tool.isolation
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class CodeLimits:
    """The code tool's limits; every field will be a config key (`agent.code_tool.*`)."""

    wall_seconds: float = 10.0  # wall-clock time of one run, interpreter start included
    cpu_seconds: int = 10  # CPU time of one run
    memory_mb: int = 512  # heap of the code's process (RLIMIT_DATA)
    output_bytes: int = 8192  # stdout+stderr kept; more stops the run
    file_mb: int = 64  # largest file the code may write in its scratch directory
    scratch_mb: int = 256  # all the files of one run together (its scratch directory is a tmpfs of this size)
    max_concurrent: int = 8  # runs at once per CodeTool (threads of its own executor)


# (lowest, highest, unit) per field: the highest are sanity bounds against typos, not recommendations.
LIMIT_BOUNDS: dict[str, tuple[float, float, str]] = {
    "wall_seconds": (0.5, 3600, "s"),
    "cpu_seconds": (1, 3600, "s"),
    "memory_mb": (64, 65536, "MB"),
    "output_bytes": (256, 16 * 1024 * 1024, "bytes"),
    "file_mb": (1, 65536, "MB"),
    "scratch_mb": (1, 65536, "MB"),
    "max_concurrent": (1, 256, ""),
}


def limits_of(settings: object) -> CodeLimits:
    """The limits a config section carries under CodeLimits' field names (rollout.agent.code_tool)."""
    return CodeLimits(**{spec.name: getattr(settings, spec.name) for spec in fields(CodeLimits)})


def code_limit_problems(limits: CodeLimits) -> list[tuple[str, str, str]]:
    """Every problem of `limits` as (field, message, fix), so the config layer reports them all at once."""
    problems = []
    defaults = CodeLimits()
    for spec in fields(CodeLimits):
        value = getattr(limits, spec.name)
        low, high, unit = LIMIT_BOUNDS[spec.name]
        wanted = "a number" if spec.type == "float" else "an integer"
        numeric = isinstance(value, int | float) if spec.type == "float" else isinstance(value, int)
        if isinstance(value, bool) or not numeric:
            problems.append((spec.name, f"is {value!r}, not {wanted}", f"set it to {wanted}, e.g. the default "
                             f"{getattr(defaults, spec.name)}"))
        elif not low <= value <= high:  # also rejects NaN
            problems.append((spec.name, f"is {value}, outside {low:g}..{high:g} {unit}".rstrip(),
                             f"set it between {low:g} and {high:g}, e.g. the default {getattr(defaults, spec.name)}"))
    return problems


@dataclass(frozen=True)
class CodeResult:
    """One run, as the rollout turns it into a tool message: never an exception."""

    ok: bool  # exited with status 0 and no limit was hit
    output: str  # stdout and stderr interleaved, at most `output_bytes` (UTF-8, undecodable bytes replaced)
    error: str | None  # for the model to read, e.g. "time limit of 5 s exceeded; the program was stopped"
    seconds: float
    killed_by: str | None = None  # the limit that ended the run: "time", "cpu", "memory" or "output"
    max_rss_mb: float | None = None  # the code's peak resident memory, when its guard could report it
    cpu_seconds: float | None = None  # the code's CPU time, when its guard could report it
    notes: tuple[str, ...] = ()  # isolation that did not hold on this node (for logs and metrics, not the model)
    isolated: bool = False  # namespaces, private /proc, read-only mounts and hidden paths all held

    def tool_text(self) -> str:
        """The text of the tool message: the output, then the error on its own line."""
        if self.error is None:
            return self.output
        return f"{self.output}{'' if not self.output or self.output.endswith(chr(10)) else chr(10)}[{self.error}]"


def run_python(
    code: str, *, limits: CodeLimits, scratch_root: Path, python: str | None = None, namespaces: bool = True,
    hide: Sequence[str] = (), isolation: str = "required",
) -> CodeResult:
    """Run `code` in the sandbox and describe how it went. `python` defaults to this interpreter (or, when the
    code runs as `nobody` and cannot reach it, /usr/bin/python3); `namespaces=False` is for nodes known to lack
    them and for tests of the fallback layer. `hide`: paths the code must not see (secrets, the trial directory,
    the training data), relative ones too; one that holds the interpreter's prefix or the scratch root is hidden
    around them (rlkit.agent.sandbox_paths); one that cannot be is a tool error under "required", a note else.
    `isolation`: "required" (a run whose namespaces, private /proc, read-only mounts or hidden paths do not hold
    is refused before the code starts: a tool error) or "best_effort" (it runs with what holds; notes say what)."""
    if isolation not in ISOLATION_LEVELS:
        return _failed(f"the code tool is misconfigured: isolation {isolation!r} is not one of "
                       f"{', '.join(ISOLATION_LEVELS)}")
    problems = code_limit_problems(limits)
    if problems:
        return _failed("the code tool is misconfigured: " + "; ".join(f"{f} {m}" for f, m, _ in problems))
    if not _is_clean_text(code):
        return _failed("the code must be UTF-8 text without NUL characters")
    uid, gid = _sandbox_user()
    notes: list[str] = []
    interpreter = _interpreter(python, uid, notes)
    if interpreter is None:
        return _failed(f"the code tool has no Python interpreter that user {uid} can run; set its `python` to one "
                       f"outside private home directories, e.g. {SYSTEM_PYTHON}")
    try:
        scratch = _make_scratch(scratch_root, uid, gid)
    except OSError as exc:
        return _failed(f"the code tool could not create a scratch directory in {scratch_root}: {exc}")
    try:
        covered = hidden_paths(hide, needed_by_run(interpreter, scratch),
                               None if isolation == "required" else notes)
    except CannotHide as exc:  # required: nothing runs
        _remove_tree(scratch)
        return _failed(refusal_text(str(exc)))
    try:
        if uid is not None and not _reachable_by_others(scratch.parent):
            return _failed(f"the code tool's scratch root {scratch_root} is not reachable by user {uid}; use a "
                           f"directory every user can traverse (mode 711), e.g. /tmp/rlkit-code-tool")
        spec = ChildSpec(
            python=interpreter, uid=uid, gid=gid, namespaces=namespaces, cpu_seconds=limits.cpu_seconds,
            memory_bytes=limits.memory_mb * 1024 * 1024, file_bytes=limits.file_mb * 1024 * 1024, code=code,
            scratch_bytes=limits.scratch_mb * 1024 * 1024,
            env=_minimal_env(scratch), hide=covered,
            required=isolation == "required",
        )
        if not fits_in_argument(spec):
            return _failed("the code is too long for the code tool (at most about 100 KB)")
        run = run_child(spec, scratch=scratch, wall_seconds=limits.wall_seconds, output_bytes=limits.output_bytes)
    finally:
        _remove_tree(scratch)
    return _describe(run, limits, namespaces, notes)


class CodeTool:
    """The code tool for asyncio rollouts: `await tool.run(code)`. Runs go to the tool's own thread pool of
    `max_concurrent` threads (the bound), not the loop's default executor, so tool calls never queue other
    `to_thread` work. A cancelled `run` still lets its sandbox finish (within the wall-clock limit)."""

    def __init__(self, limits: CodeLimits, scratch_root: Path, *, python: str | None = None,
                 hide: Sequence[str] = (), isolation: str = "required") -> None:
        self.limits = limits
        self.scratch_root = scratch_root
        self.python = python
        self.hide = tuple(hide)
        self.isolation = isolation
        self._executor = ThreadPoolExecutor(max_workers=limits.max_concurrent, thread_name_prefix="code-tool")

    async def run(self, code: str) -> CodeResult:
        job = functools.partial(run_python, code, limits=self.limits, scratch_root=self.scratch_root,
                                python=self.python, hide=self.hide, isolation=self.isolation)
        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _is_clean_text(code: object) -> bool:
    if not isinstance(code, str) or "\0" in code:
        return False
    try:
        code.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be passed to the child
        return False
    return True


def _failed(error: str) -> CodeResult:
    return CodeResult(ok=False, output="", error=error, seconds=0.0)


def _sandbox_user() -> tuple[int | None, int | None]:
    """`nobody` when we are root (uid 0 is exempt from RLIMIT_NPROC and owns most files), else ourselves."""
    if os.geteuid() != 0:
        return None, None
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _interpreter(python: str | None, uid: int | None, notes: list[str]) -> str | None:
    chosen = python or sys.executable
    if uid is None or _reachable_by_others(Path(chosen), executable=True):
        return chosen
    if python is None and _reachable_by_others(Path(SYSTEM_PYTHON), executable=True):
        notes.append(f"{chosen} is not reachable by user {uid}: the code runs with {SYSTEM_PYTHON}")
        return SYSTEM_PYTHON
    return None


def _reachable_by_others(path: Path, *, executable: bool = False) -> bool:
    """Whether any user can reach `path` (and run it): every directory above it traversable by others."""
    try:
        real = path.resolve(strict=True)
        dirs_ok = all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)
        return dirs_ok and (not executable or bool(real.stat().st_mode & stat.S_IXOTH))
    except OSError:
        return False


def _make_scratch(scratch_root: Path, uid: int | None, gid: int | None) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="code-", dir=scratch_root))
    if uid is not None and gid is not None:
        os.chown(scratch, uid, gid)
    return scratch


def _remove_tree(scratch: Path) -> None:
    """Remove the scratch directory whatever the code left in it (symlinks are not followed; directories it
    made unreadable are made readable first)."""

    def make_writable_and_retry(function: Callable[[str], object], path: str, _exc_info: object) -> None:
        parent = os.path.dirname(path)
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
        function(path)

    try:
        shutil.rmtree(scratch, onerror=make_writable_and_retry)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


def _minimal_env(scratch: Path) -> dict[str, str]:
    """Nothing inherited: no tokens, keys or RLKIT_* variables can leak; one thread for numeric libraries
    (threads cannot be started anyway)."""
    return {
        "PATH": MINIMAL_PATH, "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    }


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*$")


def _describe(run: ChildRun, limits: CodeLimits, namespaces: bool, notes: list[str]) -> CodeResult:
    """Turn the parent's and the guard's view of a run into a result with a readable error."""
    notes.extend(_isolation_notes(run.facts, namespaces))
    isolated = namespaces and run.facts.get("namespaces") == "ok" and not {
        "proc", "filesystem", "seccomp", "opens"} & set(run.facts)
    refused = run.facts.get("refused")
    if refused is not None:
        return CodeResult(ok=False, output="", error=refusal_text(str(refused)), seconds=round(run.seconds, 3),
                          notes=tuple(notes))
    output = run.output.decode("utf-8", "replace")
    killed_by, error = _limit_hit(run, limits)
    if run.start_error is not None:
        error = run.start_error
    elif error is None:
        error = _exit_error(run, output)
    rss_kb, cpu = run.facts.get("max_rss_kb"), run.facts.get("cpu_seconds")
    return CodeResult(ok=error is None, output=output, error=error, seconds=round(run.seconds, 3),
                      killed_by=killed_by, max_rss_mb=rss_kb / 1024 if isinstance(rss_kb, int) else None,
                      cpu_seconds=cpu if isinstance(cpu, float) else None, notes=tuple(notes), isolated=isolated)


def _limit_hit(run: ChildRun, limits: CodeLimits) -> tuple[str | None, str | None]:
    signal_number = run.facts.get("signal")
    cpu_used = run.facts.get("cpu_seconds")
    if run.stopped_for == "output":
        return "output", f"output truncated at {limits.output_bytes} bytes; the program was stopped"
    if run.stopped_for == "time":
        return "time", f"time limit of {limits.wall_seconds:g} s exceeded; the program was stopped"
    if signal_number == 24 or (  # SIGXCPU at the soft limit, SIGKILL at the hard one
        signal_number == 9 and isinstance(cpu_used, float) and cpu_used >= limits.cpu_seconds
    ):
        return "cpu", f"CPU time limit of {limits.cpu_seconds} s exceeded; the program was stopped"
    if run.facts.get("exit") == MEMORY_EXIT:
        return "memory", f"memory limit of {limits.memory_mb} MB exceeded"
    return None, None


def _exit_error(run: ChildRun, output: str) -> str | None:
    exit_code, signal_number = run.facts.get("exit"), run.facts.get("signal")
    if exit_code == 0:
        return None
    if isinstance(signal_number, int):
        return f"the program was killed by signal {signal_number}"
    if not isinstance(exit_code, int):
        return "the code tool's sandbox ended without reporting how the program ended"
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    reason = f": {last.strip()[:300]}" if EXCEPTION_LINE.match(last.strip()) else ""
    return f"the program exited with status {exit_code}{reason}"


def refusal_text(why: str) -> str:
    """The tool error of a refused run: what did not hold, that nothing ran, and the setting behind it."""
    return (f"the code was not run: the code tool cannot isolate it on this node ({why[:300]}), and "
            "rollout.agent.code_tool.isolation is required")


def _isolation_notes(facts: dict[str, object], namespaces: bool) -> list[str]:
    notes = []
    if not namespaces or facts.get("namespaces") != "ok":
        why = "turned off" if not namespaces else str(facts.get("namespaces", "not reported"))[:200]
        notes.append(f"no namespaces ({why}): /proc shows the node's processes, hidden paths are readable, the "
                     f"scratch directory is the host's (capped per file only, seen by concurrent runs), and the code "
                     f"can read what the job's user can and write it too unless Landlock holds; enable unprivileged "
                     f"user namespaces on the nodes")
    for fact in ("idmap", "proc", "filesystem", "keyring", "landlock", "opens", "seccomp"):
        if fact in facts:
            notes.append(str(facts[fact])[:400])
    return notes

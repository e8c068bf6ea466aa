"""The code tool's child side: the stages between the rollout process and the model's code (stdlib only).

The parent runs this file's text with `python -I -u -c SOURCE HEADER`, so it must not import rlkit. The spec (the
code included) comes through an inherited memfd the header names, never argv: argv is readable by every local user
(`ps`), and model-written code is no one else's to read. Three processes:

- supervisor (started by the parent in a new session): drops root to the sandbox user, enters new user, network,
  pid, mount, IPC and UTS namespaces, forks the guard, waits for it (killing it on the parent's SIGTERM), exits;
- guard (pid 1 of the new pid namespace): dies with the supervisor (PR_SET_PDEATHSIG) and, as a namespace's init,
  takes every process of the namespace with it; mounts a private /proc, hides the paths it is given (secrets,
  the trial, the data), makes every mount read-only but the scratch directory, which it also puts over the
  directory that holds the other runs' scratch directories, forks the runner, reports how it ended; without
  Landlock it also answers the runner's opens for writing (sandbox_opens) until the runner exits;
- runner: inherits the guard's seccomp filter (no socket of any kind, no io_uring, none of the calls of escapes:
  sandbox_seccomp.DENIED_SYSCALLS), sets the resource limits, forbids privilege gain, takes a session of its own
  and adds a filter that lets it signal only itself (sandbox_seccomp.limit_signals), then execs a fresh
  interpreter (which also drops the namespace capabilities) that installs the audit hook and runs the code
  (handed over in a memfd too).

With `required` (rollout.agent.code_tool.isolation: required, the default) a run whose isolation does not hold
(no namespaces, no private /proc, a mount that is not read-only, a path that cannot be hidden, neither Landlock nor
the guard's check of opens) never runs the code: the supervisor or the guard reports `refused` and exits.

The guard writes one JSON line per fact to the status fd; the runner never holds that fd, so code cannot forge it.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys

TYPE_CHECKING = False  # typing and traceback cost ~15 ms of CPU in each of a run's two interpreters, not imported
if TYPE_CHECKING:  # for annotations alone (run_code imports traceback for the code's interpreter)
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 283}  # keyctl(2) has no libc wrapper
KEYCTL_JOIN_SESSION_KEYRING = 1

STOP_SIGNALS = {signal.SIGTERM, signal.SIGCHLD}
MEMORY_EXIT = 3  # the runner's exit status when a MemoryError ended the code
# RLIMIT_AS beyond the heap limit: the interpreter and its libraries (bare python ~14 MB of address space, numpy
# ~170 MB); shared mappings and mapped memfds count here, which RLIMIT_DATA does not
ADDRESS_HEADROOM = 256 * 1024 * 1024
NETWORK_MESSAGE = "network is not available in the code tool"
PROCESS_MESSAGE = "starting processes is not allowed in the code tool"
NETWORK_EVENTS = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
})
PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "pty.spawn",
})


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _report(fd: int, **fact: Any) -> None:
    os.write(fd, (json.dumps(fact) + "\n").encode())


def supervise(spec: dict[str, Any]) -> None:
    """The supervisor: become the sandbox user, enter the namespaces, run the guard and wait for it."""
    status_fd = spec["status_fd"]
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 65536)
    if spec["uid"] is not None:
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    entered = False
    spec["sockets"] = _module(spec, "sandbox_mounts")["unix_socket_paths"]()  # in the job's network namespace
    if spec["namespaces"]:
        libc = _libc()
        flags = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(flags) == 0:
            entered = True
            _map_own_ids(libc, uid, gid, status_fd)
        else:
            _report(status_fd, namespaces=f"unshare failed: {os.strerror(ctypes.get_errno())}")
    if spec["required"] and not entered:  # fail closed: the code never starts
        why = "turned off" if not spec["namespaces"] else "they could not be created"
        _report(status_fd, refused=f"no namespaces ({why})")
        os._exit(0)
    alive_r, alive_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # taken by sigwait below, never by a handler
    guard_pid = os.fork()
    if guard_pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        os.close(alive_w)
        guard(spec, status_fd, alive_r, entered)
    os.close(alive_r)
    os.close(status_fd)
    os._exit(_wait_for_guard(guard_pid))


def _module(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """One of rlkit.agent.sandbox.GUARD_SOURCES, executed from the spec's text (stdlib only; `python -I` as
    `nobody` cannot import rlkit), once per process."""
    loaded: dict[str, dict[str, Any]] = spec.setdefault("loaded", {})
    if name not in loaded:
        loaded[name] = {"__name__": f"rlkit_{name}"}
        exec(compile(spec["sources"][name], f"{name}.py", "exec"), loaded[name])  # our own module's text
    return loaded[name]


def _map_own_ids(libc: ctypes.CDLL, uid: int, gid: int, status_fd: int) -> None:
    """Map this user (and group) to itself in the new user namespace, as `unshare --map-current-user` does: files
    of a file system mounted inside it (the run's tmpfs scratch directory) need an owner the namespace can name.
    A process that dropped root is not dumpable, which makes its /proc/self files root's: dumpable only for this."""
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(line)
    except OSError as exc:
        _report(status_fd, idmap=f"own ids not mapped in the user namespace: {exc}")
    finally:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _wait_for_guard(guard_pid: int) -> int:
    """Wait for the guard; on SIGTERM (the parent's stop) SIGKILL it and still wait. The guard, as the pid
    namespace's init, exits only after every process of the namespace is gone, so when we exit, all of the run
    is gone. The guard is only ever killed before we reap it: its pid cannot have been reused."""
    while True:
        if signal.sigwait(STOP_SIGNALS) == signal.SIGTERM:
            os.kill(guard_pid, signal.SIGKILL)
        pid, status = os.waitpid(guard_pid, os.WNOHANG)
        if pid == guard_pid:
            return 0 if status == 0 else 1


def guard(spec: dict[str, Any], status_fd: int, alive_r: int, entered: bool) -> None:
    """The guard: tie its life to the supervisor's, make /proc show only the sandbox, run the runner, report."""
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    poller = select.poll()
    poller.register(alive_r, select.POLLIN)
    if poller.poll(0):  # EOF: the supervisor died before the death signal was armed
        os._exit(1)
    if entered:
        _report(status_fd, namespaces="ok")
        failed = []
        if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0 or libc.mount(
            b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None
        ) != 0:
            failed.append(f"private /proc not mounted: {os.strerror(ctypes.get_errno())}")
            _report(status_fd, proc=failed[-1])
        sealed = _module(spec, "sandbox_mounts")["seal_filesystem"](
            libc, os.getcwd(), spec.get("hide", []), spec["sockets"], spec["scratch_bytes"])
        spec["env"].update(HOME=os.getcwd(), TMPDIR=os.getcwd())  # where the scratch directory is seen now
        if sealed:
            failed.append("; ".join(sealed))
            _report(status_fd, filesystem=failed[-1])
        if failed and spec["required"]:  # fail closed: the runner is never forked
            _report(status_fd, refused="; ".join(failed))
            os._exit(0)
    keyring = _fresh_session_keyring(libc)
    if keyring:
        _report(status_fd, keyring=keyring)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the runner cannot ptrace its guard
    # the seccomp filter, last (it denies keyctl and mount): NO_NEW_PRIVS lets a process without capabilities (a
    # run without namespaces) install it; the runner and the code's exec inherit it
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # the code's memfd, for the runner's exec, made before the filter denies memfd_create
    spec["code_fd"] = memfd_holding("rlkit-code", spec["code"].encode("utf-8"), inheritable=True)
    landlock = _module(spec, "sandbox_mounts")["restrict_writes"](libc, os.getcwd())
    seccomp = _module(spec, "sandbox_seccomp")
    # without Landlock the guard checks the code's opens for writing (sandbox_opens), where the kernel lets it
    unchecked = _module(spec, "sandbox_opens")["notification_works"](libc, seccomp["install_with_listener"]) \
        if landlock else ""
    denied, listener = seccomp["deny_syscalls"](libc, supervise_opens=bool(landlock) and not unchecked)
    if denied:
        _report(status_fd, seccomp=f"no seccomp filter ({denied}): sockets and io_uring are not denied")
        if spec["required"]:
            _report(status_fd, refused=f"no seccomp filter: {denied}")
            os._exit(0)
    if landlock:
        unchecked = unchecked or ("" if listener is not None else "no seccomp listener")
        note = _without_landlock(landlock, entered, unchecked)
        if note:  # "opens": a hole in a run with namespaces (not isolated); "landlock": one of the best-effort kind
            _report(status_fd, **{"opens" if entered else "landlock": note})
        if unchecked and entered and spec["required"]:
            _report(status_fd, refused=f"{landlock}; {unchecked}: host FIFOs the code's user may write would stay "
                                       "writable")
            os._exit(0)
    runner_pid = os.fork()
    if runner_pid == 0:
        os.close(status_fd)
        os.close(alive_r)
        if listener is not None:
            os.close(listener)
        run(spec)
    if listener is not None:
        _module(spec, "sandbox_opens")["answer_opens"](libc, listener, runner_pid,
                                                       seccomp["OPENS"].get(os.uname().machine, {}))
    _, status, usage = os.wait4(runner_pid, 0)
    _report(
        status_fd,
        exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        max_rss_kb=usage.ru_maxrss,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
    )
    os._exit(0)


def _without_landlock(why: str, entered: bool, unchecked: str) -> str:
    """The note of a run without Landlock ('' when nothing is left open): what its own mount namespace (read-only,
    nodev) and the guard's check of opens for writing (sandbox_opens) still hold."""
    if not unchecked:
        return "" if entered else f"{why}: the whole file system is writable as the job's user may write it (but " \
                                  "not host FIFOs and device nodes: the guard checks each open for writing)"
    return f"{why}; {unchecked}: host FIFOs " + ("the code's user may write stay writable (device nodes do not: "
                                                "the mounts are nodev)" if entered else
                                                "and device nodes stay writable, and so does the whole file system")


def _fresh_session_keyring(libc: ctypes.CDLL) -> str:
    """Join a new, empty session keyring (the trainer's holds Kerberos/AFS tokens and whatever an earlier run put
    there); '' when done or when the kernel has no keys, else why not."""
    import platform

    number = SYS_KEYCTL.get(platform.machine())
    if number is None:
        return f"session keyring not replaced: keyctl's number on {platform.machine()} is not known here"
    if libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0:
        errno = ctypes.get_errno()
        return "" if errno == 38 else f"session keyring not replaced: {os.strerror(errno)}"  # 38: ENOSYS, no keys
    return ""


def run(spec: dict[str, Any]) -> None:
    """The runner: limits first, then a fresh interpreter for the code (no inherited capabilities or modules)."""
    memory = spec["memory_bytes"]
    code_fd = spec["code_fd"]  # the guard's memfd (written before RLIMIT_FSIZE), inherited by the exec
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_seconds"], spec["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    resource.setrlimit(resource.RLIMIT_AS, (memory + ADDRESS_HEADROOM, memory + ADDRESS_HEADROOM))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"], spec["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # threads count too: the code runs single-threaded
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # for runs without a pid namespace (best effort)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.setsid()  # a process group of its own: kill(0, ...) reaches the code only, never the guard or supervisor
    signals = _module(spec, "sandbox_seccomp")["limit_signals"](libc, os.getpid())  # and nothing else's
    if signals:
        os.write(2, f"the code tool could not limit the code's signals: {signals}\n".encode())
        if spec["required"]:
            os._exit(127)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    code_spec = json.dumps({"mode": "code", "fd": code_fd})
    try:
        os.execve(spec["python"], [spec["python"], "-I", "-u", "-c", spec["source"], code_spec], spec["env"])
    except OSError as exc:
        os.write(2, f"the code tool could not start {spec['python']}: {exc}\n".encode())
    os._exit(127)


def _audit(event: str, _args: tuple[Any, ...]) -> None:
    if event in NETWORK_EVENTS:
        raise PermissionError(NETWORK_MESSAGE)
    if event in PROCESS_EVENTS:
        raise PermissionError(PROCESS_MESSAGE)


def memfd_holding(name: str, data: bytes, *, inheritable: bool) -> int:
    """An anonymous file holding `data`, read from its start; `inheritable`: kept across exec (the parent passes its
    fd through Popen's pass_fds instead)."""
    fd = os.memfd_create(name, 0 if inheritable else os.MFD_CLOEXEC)
    os.set_inheritable(fd, inheritable)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_fd(fd: int) -> str:
    """Everything in `fd` (the memfd a parent stage wrote), then close it."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def run_code(code: str) -> None:
    """Run the model's code as __main__ with the audit hook (a readable second layer: ctypes can bypass it)."""
    import traceback  # before the code runs, as it always was: the code finds the interpreter as before

    sys.addaudithook(_audit)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<code>", "exec"), namespace)  # running this code is the tool's job
    except MemoryError:
        namespace.clear()
        sys.stderr.write("MemoryError: the code tool's memory limit was exceeded\n")
        os._exit(MEMORY_EXIT)
    except SystemExit:
        raise
    except BaseException as exc:  # every failure is the model's to read
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        sys.stderr.flush()
        os._exit(1)


def main(argv: list[str]) -> None:
    header = json.loads(argv[1])
    if header["mode"] == "code":
        run_code(read_fd(header["fd"]))
    else:
        supervise(json.loads(read_fd(header["fd"])))


if __name__ == "__main__":
    main(sys.argv)

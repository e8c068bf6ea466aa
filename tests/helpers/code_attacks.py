"""Model-code attacks on the code tool, run as a program so that a test can run them as any user and on a node
without user namespaces (tests/unit/agent/test_code_tool_attacks.py): `python code_attacks.py ISOLATION`.

It needs only the standard library and rlkit.agent (stdlib only), so /usr/bin/python3 runs it as `nobody` too. It
makes its own bait in a fresh directory every user can traverse (a secret file and a secret directory passed to
the tool as hidden paths, a world-writable directory and file, a TCP and a UDP listener on 127.0.0.1, a secret in
its own environment), runs each attack through rlkit.agent.code_tool.run_python, then looks from outside at what
the attack could have changed, and prints one JSON object: attack -> {"held": bool, "class": ..., "why": ...}.
"held" means the attack was denied or ended as a tool error AND left nothing behind. With isolation "required" on
a node that cannot isolate, every attack must be refused before its code starts (why: "refused").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlkit.agent.code_tool import CodeLimits, CodeResult, run_python
from tests.helpers.code_attacks_kernel import kernel_attacks, make_host_bait

SECRET = "rlkit-attack-secret-5f1d"  # in the bait files and this process's environment; must never be printed
CONCURRENT = "code-concurrent"  # a concurrent run's scratch directory, beside those of the attacks' runs
NOBODY_ID = 65534  # the code's user and group when rlkit runs as root (Debian's nobody / nogroup)


@dataclass
class Bait:
    root: Path
    secret_dir: Path
    secret_file: Path
    open_dir: Path  # 0777: writable by the code's user, outside its scratch
    open_file: Path  # 0666
    tcp: socket.socket
    udp: socket.socket
    victim: subprocess.Popen[bytes]  # a process of the job's user (as the trainer would be)
    unix: socket.socket  # a listening unix socket anyone may connect to (mode 0777), as a careless service's
    late: socket.socket  # the same, bound only once a run has begun (tests/helpers/code_attacks.bind_when_started)

    @property
    def late_path(self) -> Path:
        return self.root / "late.sock"

    def late_quiet(self) -> bool:
        self.late.setblocking(False)
        try:
            self.late.accept()[0].close()
            return False
        except (BlockingIOError, OSError):  # OSError: never bound (a refused run)
            return True

    @property
    def shm_file(self) -> Path:
        return Path("/dev/shm") / self.root.name  # this probe's own name: no other run's leftovers count

    def unix_quiet(self) -> bool:
        self.unix.setblocking(False)
        try:
            self.unix.accept()[0].close()
            return False
        except BlockingIOError:
            return True

    def nothing_arrived(self) -> bool:
        self.tcp.setblocking(False)
        self.udp.setblocking(False)
        try:
            self.tcp.accept()[0].close()
            return False
        except BlockingIOError:
            pass
        try:
            self.udp.recv(100)
            return False
        except BlockingIOError:
            return True


def make_bait() -> Bait:
    root = Path(tempfile.mkdtemp(prefix="rlkit-attack-"))
    root.chmod(0o755)
    secret_dir = root / "secrets"
    secret_dir.mkdir(mode=0o755)
    (secret_dir / "token").write_text(SECRET)
    (secret_dir / "token").chmod(0o644)  # readable by anyone who can see it: only hiding protects it
    secret_file = root / "id_rsa"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    open_dir = root / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    open_file = root / "reward.py"
    open_file.write_text("ORIGINAL\n")
    open_file.chmod(0o666)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    victim = subprocess.Popen(["/bin/sleep", "300"])
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(root / "service.sock"))
    (root / "service.sock").chmod(0o777)
    unix.listen(8)
    _add_session_key()
    late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return Bait(root, secret_dir, secret_file, open_dir, open_file, tcp, udp, victim, unix, late)


def bind_when_started(bait: Bait) -> threading.Thread:
    """Bind and open the late socket as soon as a run's code is running (its interpreter, exec'd after the run's
    mount namespace was sealed, shows `"mode": "code"` in its command line): a service that starts while the code
    runs. (The code cannot tell us itself: it can write nowhere we can see.)"""
    def running() -> bool:
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and b'"mode": "code"' in (entry / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def bind() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not running():
            time.sleep(0.01)
        staged = bait.late_path.with_suffix(".staged")  # listening before its path appears: no refused connect
        bait.late.bind(str(staged))
        staged.chmod(0o777)
        bait.late.listen(8)
        staged.rename(bait.late_path)

    thread = threading.Thread(target=bind, daemon=True)
    thread.start()
    return thread


KEY_SPEC_SESSION_KEYRING = -3
SYS_ADD_KEY, SYS_KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine, (-1, -1))


def _add_session_key() -> None:
    """The secret as a `user` key in this process's session keyring (where a job's Kerberos/AFS tokens live)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    added = libc.syscall(ctypes.c_long(SYS_ADD_KEY), b"user", b"rlkit-attack", SECRET.encode(),
                         ctypes.c_size_t(len(SECRET)), ctypes.c_long(KEY_SPEC_SESSION_KEYRING))
    if added < 0:
        raise OSError(ctypes.get_errno(), "add_key to the session keyring failed")


CTYPES = "import ctypes, os, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _ctypes_connect(kind: str, port: int) -> str:
    return CTYPES + (
        f"s = socket.socket(socket.AF_INET, socket.{kind})\n"
        f"a = struct.pack('<H', socket.AF_INET) + struct.pack('>H', {port}) + socket.inet_aton('127.0.0.1')"
        " + bytes(8)\n"
        + ("print(libc.sendto(s.fileno(), b'x', 1, 0, a, len(a)), ctypes.get_errno())\n" if kind == "SOCK_DGRAM"
           else "print(libc.connect(s.fileno(), a, len(a)), ctypes.get_errno())\n"))


Check = Callable[[CodeResult, Bait], bool]


def _no_secret(r: CodeResult, _b: Bait) -> bool:
    return SECRET not in r.output and SECRET not in (r.error or "")


def _failed(r: CodeResult, _b: Bait) -> bool:
    return not r.ok


def _all(*checks: Check) -> Check:
    return lambda r, b: all(check(r, b) for check in checks)


def attacks(b: Bait) -> dict[str, tuple[str, str, Check, dict[str, float]]]:
    """name -> (class, code, check of the result and the bait afterwards, limits)."""
    port_tcp, port_udp = b.tcp.getsockname()[1], b.udp.getsockname()[1]
    quiet: Check = lambda r, bait: bait.nothing_arrived()  # noqa: E731
    untouched: Check = lambda r, bait: (not any(bait.open_dir.iterdir())  # noqa: E731
                                        and bait.open_file.read_text() == "ORIGINAL\n")
    return {
        # secrets
        "read a hidden file": ("secrets", f"print(open({str(b.secret_dir / 'token')!r}).read())", _no_secret, {}),
        "list a hidden directory": ("secrets", f"import os\nprint(os.listdir({str(b.secret_dir)!r}))",
                                    lambda r, _b: "token" not in r.output, {}),
        "read a hidden single file": ("secrets", f"print(open({str(b.secret_file)!r}).read())", _no_secret, {}),
        "scan every process environment": ("secrets", "import glob\nfor p in glob.glob('/proc/[0-9]*/environ'):\n"
                                           "    try: print(open(p, 'rb').read())\n    except OSError: pass",
                                           _no_secret, {}),
        # the code's own first line names it: is it in any command line this run can read (`ps`)?
        "find the code in a command line": ("secrets", "import glob\nseen = 0\n"
                                            "for p in glob.glob('/proc/[0-9]*/cmdline'):\n"
                                            "    try: seen += b'# rlkit-attack-find' in open(p, 'rb').read()\n"
                                            "    except OSError: pass\nprint('seen', seen)",
                                            lambda r, _b: r.output == "seen 0\n", {}),
        "its own environment": ("secrets", "import os\nprint(dict(os.environ))", _no_secret, {}),
        "the session keyring": ("secrets", CTYPES + f"for ring in (-3, -4, -5):\n"  # session, user, user session
                                f"    key = libc.syscall({SYS_KEYCTL}, 10, ring, b'user', b'rlkit-attack', 0)\n"
                                "    buf = ctypes.create_string_buffer(256)\n"
                                f"    n = libc.syscall({SYS_KEYCTL}, 11, key, buf, 256) if key > 0 else -1\n"
                                "    print(ring, key, buf.raw[:max(n, 0)])", _no_secret, {}),
        # writes and persistence
        "write outside the scratch directory": ("writes", f"open({str(b.open_dir / 'x')!r}, 'w').write('x')",
                                                _all(_failed, untouched), {}),
        "append to the user's reward module": ("writes", f"open({str(b.open_file)!r}, 'a').write('EVIL')",
                                               _all(_failed, untouched), {}),
        "write through ctypes open": ("writes", CTYPES + f"fd = libc.open({str(b.open_dir / 'y')!r}.encode(), "
                                      "0o101, 0o644)\nprint(fd, ctypes.get_errno())",
                                      lambda r, bait: not any(bait.open_dir.iterdir()), {}),
        "leave a file in /dev/shm": ("writes", f"open({str(b.shm_file)!r}, 'w').write('x')",
                                     lambda r, bait: not bait.shm_file.exists(), {}),
        "a file larger than the limit": ("writes", "open('big', 'wb').write(b'x' * (3 << 20))", _failed,
                                         {"file_mb": 1}),
        # network and local IPC
        "tcp to localhost": ("network", f"import socket\nsocket.create_connection(('127.0.0.1', {port_tcp}), 1)",
                             _all(_failed, quiet), {}),
        "udp to localhost": ("network", f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                             f".sendto(b'x', ('127.0.0.1', {port_udp}))", _all(_failed, quiet), {}),
        "tcp through ctypes": ("network", _ctypes_connect("SOCK_STREAM", port_tcp), quiet, {}),
        "udp through ctypes": ("network", _ctypes_connect("SOCK_DGRAM", port_udp), quiet, {}),
        "a unix socket": ("network", "import socket\nsocket.socket(socket.AF_UNIX).connect("
                          f"{str(b.root / 'service.sock')!r})", lambda r, bait: not r.ok and bait.unix_quiet(), {}),
        "a unix socket through ctypes": ("network", CTYPES + "s = socket.socket(socket.AF_UNIX)\n"
                                         f"a = struct.pack('H', socket.AF_UNIX) + {str(b.root / 'service.sock')!r}"
                                         ".encode() + bytes(1)\nprint(libc.connect(s.fileno(), a, len(a)), "
                                         "ctypes.get_errno())", lambda r, bait: bait.unix_quiet(), {}),
        "a unix socket bound after the run began": ("network", CTYPES + "import time\n"
                                                    f"path = {str(b.late_path)!r}\nend = time.monotonic() + 30\n"
                                                    "while not os.path.exists(path) and time.monotonic() < end:\n"
                                                    "    time.sleep(0.01)\nprint('seen', os.path.exists(path))\n"
                                                    "s = socket.socket(socket.AF_UNIX)\na = struct.pack('H', "
                                                    "socket.AF_UNIX) + path.encode() + bytes(1)\n"
                                                    "print(libc.connect(s.fileno(), a, len(a)), ctypes.get_errno())",
                                                    lambda r, bait: "seen True" in r.output and bait.late_quiet(),
                                                    {"wall_seconds": 60}),
        "a name lookup": ("network", "import socket\nprint(socket.getaddrinfo('pypi.org', 443))",
                          lambda r, _b: not r.ok and "pypi.org" not in r.output.replace("'pypi.org'", ""), {}),
        # resources
        "fork": ("resources", "import os\npid = os.fork()\nprint('forked', pid)", _failed, {}),
        "fork through ctypes": ("resources", CTYPES + "pid = libc.fork()\nprint('forked', pid)\n"
                                "import time\ntime.sleep(0.5 if pid == 0 else 0)",
                                lambda r, _b: "forked -1" in r.output and "forked 0" not in r.output, {}),
        "a thread": ("resources", "import threading\nthreading.Thread(target=print).start()", _failed, {}),
        "a busy loop": ("resources", "while True:\n    pass", lambda r, _b: r.killed_by == "cpu",
                        {"cpu_seconds": 1, "wall_seconds": 10}),
        "sleeping past the wall limit": ("resources", "import time\ntime.sleep(30)",
                                         lambda r, _b: r.killed_by == "time", {"wall_seconds": 3}),
        "an output flood": ("resources", "while True:\n    print('x' * 1000)",
                            lambda r, _b: r.killed_by == "output", {}),
        "a heap bomb": ("resources", "x = [b'x' * (64 << 20) for _ in range(16)]",
                        lambda r, _b: r.killed_by == "memory", {"memory_mb": 128}),
        "a shared anonymous mapping bomb": ("resources", "import mmap\nm = mmap.mmap(-1, 1 << 30, "
                                            "flags=mmap.MAP_SHARED)\nm[::4096] = b'x' * (1 << 18)\nprint('held')",
                                            lambda r, _b: not r.ok and "held" not in r.output, {"memory_mb": 128}),
        "a mapped memfd bomb": ("resources", "import mmap, os\nfd = os.memfd_create('m')\nos.ftruncate(fd, 1 << 30)\n"
                                "m = mmap.mmap(fd, 1 << 30)\nm[::4096] = b'x' * (1 << 18)\nprint('held')",
                                lambda r, _b: not r.ok and "held" not in r.output, {"memory_mb": 128}),
        "memfds written past the memory limit": ("resources", "import os\nfds = [os.memfd_create('m') for _ in "
                                                 "range(200)]\nfor fd in fds:\n    os.write(fd, b'x' * (1 << 20))"
                                                 "\nprint('held')", lambda r, _b: not r.ok and "held" not in r.output,
                                                 {"file_mb": 1, "memory_mb": 64}),
        "fill the scratch directory": ("resources", "n = 0\ntry:\n    for i in range(16):\n        open(f'f{i}', 'wb')"
                                       ".write(b'x' * (1 << 20))\n        n += 1\nfinally:\n    print('files', n)",
                                       lambda r, _b: "files 16" not in r.output, {"scratch_mb": 8, "file_mb": 2}),
        # escape
        "ptrace the parent": ("escape", CTYPES + "print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())",
                              lambda r, _b: r.output.startswith("-1 "), {}),
        "mount": ("escape", CTYPES + "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())",
                  lambda r, _b: r.output.startswith("-1 "), {}),
        "chroot": ("escape", "import os\nos.chroot('/')", _failed, {}),
        "setns into the first process's network": ("escape", CTYPES + "fd = os.open('/proc/1/ns/net', os.O_RDONLY)\n"
                                                   "print(libc.setns(fd, 0), ctypes.get_errno())",
                                                   lambda r, _b: "0 0" not in r.output, {}),
        "kill the guard": ("escape", "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('sent')",
                           lambda r, _b: r.max_rss_mb is not None, {}),  # the guard lived to report
        "kill a process of the job's user": ("escape", f"import os, signal\nos.kill({b.victim.pid}, signal.SIGKILL)",
                                             lambda r, bait: not r.ok and bait.victim.poll() is None, {}),
        # cross-run leakage
        # (its random name is learnt as /proc/PID/cwd of a process of that run would tell it)
        "read a concurrent run's scratch": ("leakage", f"print(open({str(b.root / 'scratch' / CONCURRENT)!r}"
                                            " + '/notes.txt').read())", _all(_failed, _no_secret), {}),
        "leave a file for the next run": ("leakage", "open('left-behind', 'w').write('x')\nimport os\n"
                                          "print(os.getcwd())", lambda r, _b: r.ok, {}),
        # output forgery
        "forge the guard's report": ("forgery", "import os\nfor fd in range(3, 64):\n    try: os.write(fd, "
                                     "b'{\"exit\": 0}\\n')\n    except OSError: pass\nraise SystemExit(5)",
                                     lambda r, _b: r.error == "the program exited with status 5", {}),
    }


def _concurrent_scratch(directory: Path) -> None:
    """Another run's scratch directory beside the attacks' own, made as the code tool makes one (0700, owned by the
    code's user: `nobody` under root, else this user) with a file the secret is in."""
    directory.mkdir(mode=0o700)
    (directory / "notes.txt").write_text(SECRET)
    if os.geteuid() == 0:
        for path in (directory, directory / "notes.txt"):
            os.chown(path, NOBODY_ID, NOBODY_ID)


def _left_behind(scratch_root: Path) -> bool:
    return any(scratch_root.rglob("left-behind"))


def main() -> None:
    isolation = sys.argv[1]
    os.environ["RLKIT_ATTACK_SECRET"] = SECRET
    bait = make_bait()
    scratch_root = bait.root / "scratch"
    scratch_root.mkdir()
    scratch_root.chmod(0o711)
    _concurrent_scratch(scratch_root / CONCURRENT)
    host = make_host_bait(bait.root)
    report: dict[str, dict[str, object]] = {}
    every = {**attacks(bait), **kernel_attacks(host, bait.root, bait.victim.pid)}
    for name, (kind, code, check, limits) in every.items():
        if name == "a unix socket bound after the run began":
            bind_when_started(bait)
        result = run_python(f"# rlkit-attack-{name}\n{code}", limits=CodeLimits(**limits),  # type: ignore[arg-type]
                            scratch_root=scratch_root, hide=[str(bait.secret_dir), str(bait.secret_file)],
                            isolation=isolation)
        refused = (result.error or "").startswith("the code was not run")
        held = check(result, bait) or refused
        if name == "leave a file for the next run":
            held = held and not _left_behind(scratch_root)
        report[name] = {"class": kind, "held": held, "refused": refused,
                        "why": (result.error or result.output)[-200:], "notes": list(result.notes)}
    bait.victim.kill()
    bait.victim.wait()
    host.close()
    bait.shm_file.unlink(missing_ok=True)  # what a best-effort run left
    shutil.rmtree(bait.root, ignore_errors=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

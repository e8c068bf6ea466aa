"""The code tool's file-system view (stdlib only): what the guard of rlkit/agent/sandbox_child.py does in the run's
own mount namespace, and the Landlock rules it adds with or without one. Like sandbox_seccomp.py, the guard
executes this file's text from the spec (rlkit.agent.sandbox.GUARD_SOURCES): it cannot import rlkit.

Why each step:
- unix sockets of /proc/net/unix covered with /dev/null: a read-only mount does not stop connect(2);
- hidden paths covered (a directory by an empty read-only tmpfs, a file by /dev/null);
- /dev replaced by a minimal one (null, zero, full, random, urandom and the fd links): no /dev/ptmx or /dev/pts
  (ptys two runs could talk through, the user's terminals), no /dev/shm or /dev/mqueue, no GPU or other device
  node of the host;
- every mount read-only and nodev but the device nodes of the minimal /dev (one recursive mount_setattr, or
  before Linux 5.12 a remount of each mount): a read-only mount does not stop writes into a device node, nodev
  does (a host device node outside /dev, e.g. a 0666 copy of a GPU's or a pty's);
- the scratch directory: a tmpfs of `scratch_bytes` and at most one inode per INODE_BYTES of it (empty files and
  directories are kernel memory its byte cap does not count), over the directory of every run's scratch;
- Landlock (Linux >= 5.13, where the kernel enables it): opening for writing, creating, removing and truncating
  only beneath the scratch directory and on /dev/null, /dev/zero, /dev/full. A read-only mount does not stop
  writes into FIFOs (a 0666 FIFO of another user, the user's own), Landlock does (without it, the guard checks
  each open for writing: sandbox_opens.py); without namespaces (best_effort) it is the only thing that keeps the
  host file system read-only. From ABI 6 (Linux 6.12) it also scopes signals and abstract unix sockets to the
  run: no signal to a process outside it (the job user's own, without a pid namespace), a second layer under the
  seccomp filter's limit on kill(2).
"""

from __future__ import annotations

import ctypes
import os

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_RDONLY, MS_REMOUNT = 2, 4, 8, 4096, 1, 32
ENOSYS = 38
# per-mount flags a remount inside a user namespace must keep (the kernel locks them): mountinfo's names
REMOUNT_KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048,
                "relatime": 1 << 21}
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000  # Linux >= 5.12, every arch
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NODEV = 0x1, 0x4
MAX_SOCKETS = 4096  # unix sockets covered per run (a node with more is refused under `required`)
INODE_BYTES = 16 * 1024  # the scratch tmpfs has one inode per this many bytes of its size (at least MIN_INODES)
MIN_INODES = 1024
DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
# Landlock (every architecture): create_ruleset, add_rule, restrict_self; the rights of ABI 1, 2 (refer), 3
SYS_LANDLOCK = (444, 445, 446)
LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_CREATE_RULESET_VERSION = 1, 1
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
WRITE_RIGHTS_ABI1 = WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # remove, make char/dir/reg/sock/fifo/...
REFER = 1 << 13
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def scratch_inodes(scratch_bytes: int) -> int:
    return max(MIN_INODES, scratch_bytes // INODE_BYTES)


def unix_socket_paths() -> list[str]:
    """The file-system paths of the unix sockets listening in this network namespace (/proc/net/unix): a new network
    namespace hides only abstract sockets, so each one is covered in the run's mount namespace (the MUNGE socket, a
    0777 socket of another user's service, ...). Read by the supervisor before it leaves the job's namespace."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return []
    paths = {fields[7] for fields in (row.split() for row in rows) if len(fields) >= 8 and fields[7].startswith("/")}
    return sorted(paths)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _mount_setattr(libc: ctypes.CDLL, path: str, flags: int, attr: _MountAttr) -> int:
    return int(libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                            ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))))


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def seal_filesystem(libc: ctypes.CDLL, scratch: str, hide: list[str], sockets: list[str],
                    scratch_bytes: int) -> list[str]:
    """In the run's own mount namespace: the steps of the module's docstring, in order. The run sees its own
    scratch files only, at the scratch directory's parent, its working directory, and they vanish with its mount
    namespace. Returns what did not hold; the guard reports it."""
    problems = []
    nulls = []  # the paths covered with /dev/null: readable as empty files (nodev would make them unopenable)
    if len(sockets) > MAX_SOCKETS:
        problems.append(f"{len(sockets)} unix sockets on the node, more than the {MAX_SOCKETS} the code tool covers")
    for path in sockets[:MAX_SOCKETS]:  # before the directories: a socket under a hidden directory is gone anyway
        if os.path.lexists(path) and libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) != 0:
            errno = ctypes.get_errno()
            if os.path.lexists(path):  # not a race with its removal
                problems.append(f"unix socket {path} is not covered: {os.strerror(errno)}")
        elif os.path.lexists(path):
            nulls.append(path)
    for path in hide:
        if os.path.isdir(path):
            done = libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                              b"size=4k,mode=0500")
        elif os.path.lexists(path):
            done = libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None)
            nulls.append(path)
        else:
            continue
        if done != 0:
            problems.append(f"{path} is not hidden: {_errno_text()}")
    dev = _minimal_dev(libc)
    if dev:
        problems.append(dev)
    devices = [f"/dev/{name}" for name in DEV_NODES]
    if _mount_setattr(libc, "/", AT_RECURSIVE, _MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV)) != 0:
        if ctypes.get_errno() != ENOSYS:
            return [*problems, f"the file system is not read-only: {_errno_text()}"]
        failed = _remount_each(libc, devices + nulls)  # a kernel before 5.12: every mount remounted on its own
        if failed:
            return [*problems, f"the file system is not read-only: {failed}"]
    else:
        for device in devices if not dev else ():  # the minimal /dev's nodes are devices again
            if _mount_setattr(libc, device, 0, _MountAttr(attr_clr=MOUNT_ATTR_NODEV)) != 0:
                problems.append(f"{device} is not usable: {_errno_text()}")
        for path in nulls:  # where this fails (a cover under a hidden directory), the cover stays unopenable
            _mount_setattr(libc, path, 0, _MountAttr(attr_clr=MOUNT_ATTR_NODEV))
    others = os.path.dirname(scratch)
    options = f"size={scratch_bytes},nr_inodes={scratch_inodes(scratch_bytes)},mode=0700".encode()
    if libc.mount(b"tmpfs", others.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return [*problems, f"the scratch directory is not mounted: {_errno_text()}"]
    os.chdir(others)  # the new, empty, writable tmpfs; the read-only host directories under it are not seen
    if not os.access(".", os.W_OK):
        return [*problems, "the scratch directory is not writable"]
    return problems


def _minimal_dev(libc: ctypes.CDLL) -> str:
    """A tmpfs over /dev holding binds of DEV_NODES and DEV_LINKS' links (as bubblewrap's --dev); '' when done."""
    fds = {}
    try:
        for name in DEV_NODES:
            fds[name] = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
        if libc.mount(b"tmpfs", b"/dev", b"tmpfs", MS_NOSUID | MS_NOEXEC, b"size=64k,nr_inodes=64,mode=0755") != 0:
            return f"/dev is not replaced: {_errno_text()}"
        for name, fd in fds.items():
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            if libc.mount(f"/proc/self/fd/{fd}".encode(), f"/dev/{name}".encode(), None, MS_BIND, None) != 0:
                return f"/dev/{name} is not bound: {_errno_text()}"
        for name, target in DEV_LINKS.items():
            os.symlink(target, f"/dev/{name}")
    except OSError as exc:
        return f"/dev is not replaced: {exc}"
    finally:
        for fd in fds.values():
            os.close(fd)
    return ""


def _remount_each(libc: ctypes.CDLL, devices: list[str]) -> str:
    """Without mount_setattr: remount every mount of this namespace read-only and nodev (but `devices`), one
    mount(MS_REMOUNT | MS_BIND) each, keeping the flags a user namespace may not drop (nosuid, nodev, noexec, the
    atime ones); '' when all held, else the first that did not."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        rows = [line.split() for line in f]
    for row in rows:
        point = row[4].encode().decode("unicode_escape").encode("latin-1")  # mountinfo escapes space as \040
        options = set(row[5].split(","))
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | (0 if point.decode(errors="replace") in devices else MS_NODEV)
        flags |= sum(flag for name, flag in REMOUNT_KEPT.items() if name in options)
        if libc.mount(None, point, None, flags, None) != 0:
            errno = ctypes.get_errno()
            if os.path.lexists(point):  # not one removed meanwhile
                return f"{point.decode(errors='replace')}: {os.strerror(errno)}"
    return ""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict_writes(libc: ctypes.CDLL, scratch: str) -> str:
    """Landlock: writes (open for writing, create, remove, rename across, truncate) only beneath `scratch` and on
    WRITABLE_DEVICES, and from ABI 6 signals and abstract unix sockets only within, for this process and what it
    starts; '' when in force, else why not. Needs PR_SET_NO_NEW_PRIVS first."""
    create, add, restrict = (ctypes.c_long(number) for number in SYS_LANDLOCK)
    abi = int(libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION)))
    if abi < 1:
        return f"no Landlock on this kernel ({_errno_text()})"
    rights = WRITE_RIGHTS_ABI1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(rights, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else ctypes.sizeof(ctypes.c_uint64)  # older ABIs: the first field only
    ruleset = int(libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if ruleset < 0:
        return f"no Landlock ruleset: {_errno_text()}"
    try:
        for path, allowed in ((scratch, rights), *((device, rights & (WRITE_FILE | TRUNCATE))
                                                   for device in WRITABLE_DEVICES)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(allowed, fd)
                if libc.syscall(add, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return f"Landlock rule for {path} refused: {_errno_text()}"
            finally:
                os.close(fd)
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"Landlock not in force: {_errno_text()}"
    except OSError as exc:
        return f"Landlock not in force: {exc}"
    finally:
        os.close(ruleset)
    return ""

"""Step 0 of every job, on each node, before any work: the faults users meet most after a long wait in the queue,
reported in seconds with the node's name and the fix, instead of servers and a trainer that never find each other.

Each node of each component (one task per node, in the component's image when the job uses containers) checks that
  * it reads the token the batch script has just written in the trial directory (a fileroot some node does not
    share: node-local /tmp, a disk of the login node only);
  * it runs the rlkit that validated the job at submit (rlkit.source_id, recorded in the trial directory): an image
    built from other code, or a launcher.python with another install, would read the config differently;
  * it sees as many GPUs as its component asked for, counted the way its processes will see them (`nvidia-smi -L`
    narrowed by CUDA_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES as Slurm set it); in a container without `--nv`
    there is no driver and no nvidia-smi;
  * it reaches the work component's first node (the trainer's rank 0, where the rendezvous and the weight sync
    listen) over TCP: that node listens on a free port and prints `host:port node` after a marker; the batch script
    (which sees the trial directory: it wrote the token) writes that line into a file it created empty beside the
    token, and every other node reads it there and connects. Through srun's output, not the first node's own write,
    so that a first node that cannot see the trial directory is still reached (one fault, one line); the file
    exists before anyone reads it, since on NFS a name looked up before it exists can stay "missing" for a minute.
Every check runs whatever the others found, and each problem is one line, so the log names every broken part at
once. Torch-free and quick to import: it runs on every node of every job.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.nameresolve.servers import check_address
from rlkit.slurm.hostlist import expand_hostlist
from rlkit.slurm.jobenv import JobEnv, advertised_host
from rlkit.source_id import describe, source_id
from rlkit.step_contract import NODE_CHECK_ADDRESS_MARK
from rlkit.trials.paths import TrialPaths

ADDRESS_WAIT_S = 20.0  # how long a node waits for the first node's address: the sruns (and containers) start apart
CONNECT_TIMEOUT_S = 5.0  # a TCP connect and the listener's answer
SMI_TIMEOUT_S = 10.0
HELLO_ANSWER = b"rlkit node-check ok\n"  # the listener's reply: the connection reached this check, not another server
NETWORK_FIX = ("open the ports between the job's nodes (the trainer's rendezvous, the weight sync and the servers "
               "listen on free TCP ports) or check the network between them")
_GPU_LINE = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[0-9A-Za-z-]+)\)")
_MIG_UUID = re.compile(r"\(UUID: (MIG-[0-9A-Za-z/-]+)\)")


def canary_seen(path: str) -> str:
    """What a node reads in the canary file: its text, or why it cannot ("unreadable (reason)")."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(200).strip()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def canary_problem(node: str, canary: str, token: str, writer: str) -> str | None:
    if canary_seen(canary) == token:
        return None
    return (f"node {node} does not see the trial directory {os.path.dirname(canary)} that node {writer} wrote in: "
            "cluster.fileroot must be on a filesystem every compute node mounts at the same path (not node-local "
            "/tmp, not a disk of the login node only)")


@dataclass(frozen=True)
class GpuView:
    """The GPUs a process started here would see, and how that was counted (for the report)."""

    count: int
    how: str
    smi_found: bool


def nvidia_smi_listing() -> tuple[str | None, str]:
    """(`nvidia-smi -L` output or None when it is missing or fails, why it failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, ""
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi -L did not answer: {exc}"
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()
        return None, f"nvidia-smi -L failed: {last[-1] if last else f'exit {done.returncode}'}"
    return done.stdout, ""


def visible_gpus(cuda_visible: str | None, smi_listing: str | None) -> GpuView:
    """Count as CUDA does: CUDA_VISIBLE_DEVICES (indices or UUID prefixes) narrows the devices the driver lists and
    stops at its first entry that names none; unset, every listed device is visible. Without a listing, the entries
    Slurm put in CUDA_VISIBLE_DEVICES are the count."""
    entries = [e.strip() for e in cuda_visible.split(",")] if cuda_visible is not None else None
    shown = f"CUDA_VISIBLE_DEVICES={cuda_visible}" if cuda_visible is not None else "CUDA_VISIBLE_DEVICES unset"
    if smi_listing is None:
        count = 0
        for entry in entries or []:
            if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
                break
            count += 1
        return GpuView(count, f"no nvidia-smi, {shown}", False)
    indices: list[str] = []
    uuids: list[str] = []
    for line in smi_listing.splitlines():
        if gpu := _GPU_LINE.match(line.strip()):
            indices.append(gpu.group(1))
            uuids.append(gpu.group(2))
        elif mig := _MIG_UUID.search(line):
            uuids.append(mig.group(1))
    if entries is None:
        return GpuView(len(indices), f"nvidia-smi -L lists {len(indices)}, {shown}", True)
    seen: set[str] = set()
    for entry in entries:
        matches = [entry] if entry in indices else [u for u in uuids if entry and u.startswith(entry)]
        if len(matches) != 1:
            break
        seen.add(matches[0])
    return GpuView(len(seen), f"nvidia-smi -L lists {len(indices)}, {shown}", True)


@dataclass(frozen=True)
class GpuShortfall:
    """What is wrong with a node's GPUs and its fix, without the node's name (`rlkit doctor` groups nodes by it)."""

    detail: str
    fix: str


def gpu_shortfall(role: str, expected: int, view: GpuView, *, in_container: bool,
                  smi_error: str = "") -> GpuShortfall | None:
    """Fewer GPUs than asked for starve the step; more mean Slurm did not confine it to its own (a GPU-less client
    never uses one, so it passes either way). In a container, Slurm's variable alone proves nothing: apptainer
    brings the driver (and nvidia-smi with it) only with --nv. The one judgement of step 0 and `rlkit doctor`."""
    if expected == 0:
        return None
    said = f"sees {view.count} GPU(s) ({view.how}) but its {role} component asked for {expected}"
    if smi_error:
        return GpuShortfall(f"{said}; {smi_error}", "check the node's NVIDIA driver (and, in a container, --nv)")
    if in_container and not view.smi_found:
        return GpuShortfall(f"has no NVIDIA driver inside its {role} container (no nvidia-smi there; "
                            f"{view.how.removeprefix('no nvidia-smi, ')}) but the component asked for {expected} "
                            "GPU(s)", "add --nv to launcher.slurm.apptainer_args")
    if view.count == expected:
        return None
    return GpuShortfall(said, "check the partition's GPUs (gres gpu:N, cluster.n_gpus_per_node) and that "
                              "launcher.slurm.srun_additional_args asks for no other GPUs")


def gpu_problem(node: str, role: str, expected: int, view: GpuView, *, in_container: bool,
                smi_error: str = "") -> str | None:
    """`gpu_shortfall` as step 0 reports it: one line naming the node, then the fix."""
    shortfall = gpu_shortfall(role, expected, view, in_container=in_container, smi_error=smi_error)
    return None if shortfall is None else f"node {node} {shortfall.detail}: {shortfall.fix}"


def _connect_host(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def listen_and_publish(node: str, publish: Callable[[str], None]) -> tuple[socket.socket | None, str | None]:
    """Listen on a free port of every interface and publish `host:port node` (host: what the trainer's rank 0
    advertises for its rendezvous, rlkit.slurm.jobenv.advertised_host)."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    try:
        server = socket.create_server(("", 0), family=family, backlog=128, dualstack_ipv6=family == socket.AF_INET6)
    except OSError as exc:
        return None, f"node {node} cannot listen on a TCP port: {exc.strerror or exc}: {NETWORK_FIX}"
    try:
        address = check_address(f"{advertised_host()}:{server.getsockname()[1]}")
    except ValueError as exc:
        server.close()
        return None, f"node {node} cannot be reached at what it advertises: {exc}: fix RLKIT_ADVERTISE_HOST"
    publish(f"{NODE_CHECK_ADDRESS_MARK} {address} {node}")
    return server, None


def serve_peers(server: socket.socket, token: str, peers: int, deadline: float) -> int:
    """Answer the other nodes' hellos until all `peers` have said hello or the deadline passes; how many did."""
    heard = 0
    with server:
        while heard < peers and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            with conn:
                try:  # a peer's hello within CONNECT_TIMEOUT_S and the deadline, however it trickles in
                    if _read_line(conn, min(time.monotonic() + CONNECT_TIMEOUT_S, deadline)).partition(" ")[0] == token:
                        conn.sendall(HELLO_ANSWER)
                        heard += 1
                except OSError:
                    continue  # not one of ours, or it gave up: its own line says so
    return heard


def _read_line(conn: socket.socket, deadline: float, limit: int = 512) -> str:
    """One line (at most `limit` bytes) by `deadline` (TimeoutError after it): a socket timeout alone is per recv,
    so a sender trickling a byte at a time would hold the read for `limit` timeouts."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole line within the deadline ({len(data)} bytes came)")
        conn.settimeout(left)
        chunk = conn.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def read_published(address_file: str, wait_s: float) -> tuple[str, str] | None:
    """(host:port, node) once the batch script has written the first node's whole, valid line; None after
    `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(address_file, encoding="utf-8", errors="replace") as f:
                text = f.read(600)
        except OSError:
            text = ""
        if text.endswith("\n"):
            address, _, node = text.strip().partition(" ")
            try:
                return check_address(address), re.sub(r"[^\w.-]", "?", node)[:100]
            except ValueError:
                pass  # not what the listener writes: keep waiting, then report it as missing
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def reach_problem(address: str, token: str, node: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Connect to the listener at `address`, say hello, expect its answer; the reason when that fails."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((_connect_host(host), int(port)), timeout=timeout_s) as conn:
            conn.sendall(f"{token} {node}\n".encode())
            answer = _read_line(conn, time.monotonic() + timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as exc:
        return str(exc.strerror or exc)
    if answer.encode() + b"\n" != HELLO_ANSWER:
        return f"something other than this check answers there ({answer[:60]!r})"
    return None


def _target_node(group: int) -> str:
    """The work component's first node, from the job's hostlist (named before its address arrives)."""
    hostlist = os.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}") or os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        return expand_hostlist(hostlist)[0]
    except (ValueError, IndexError):
        return "(its first node)"


def run(args: argparse.Namespace, report: Callable[[str], None], publish: Callable[[str], None]) -> bool:
    """Every check of this node, each problem handed to `report` as soon as it is found; True when all passed.
    GPUs first: the first node then publishes its address and serves until every other node said hello (or it is
    too late for them), and, should Slurm end its step early, has already said everything."""
    env = JobEnv.from_environ()
    node = env.node_name
    problems: list[str] = []

    def found(problem: str | None) -> None:
        if problem:
            problems.append(problem)
            report(problem)

    sees_dir = canary_problem(node, args.canary, args.token, args.writer)
    found(sees_dir)
    if sees_dir is None:
        found(source_problem(node, args.role, os.path.dirname(args.canary), in_container=args.container))
    listing, smi_error = nvidia_smi_listing()
    view = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), listing)
    found(gpu_problem(node, args.role, args.gpus, view, in_container=args.container, smi_error=smi_error))
    if args.target_group is None:
        return not problems  # a job of one node: nobody to reach
    if args.listen is not None and env.node_index == 0:
        server, unreachable = listen_and_publish(node, publish)
        found(unreachable)
        if server is not None:
            serve_peers(server, args.token, args.listen, time.monotonic() + args.address_wait + CONNECT_TIMEOUT_S + 2)
        return not problems
    if sees_dir is not None:
        return not problems  # the address is in the trial directory this node cannot see
    target = f"the {args.target_role}'s node"
    published = read_published(args.address_file, args.address_wait)
    if published is None:
        found(f"node {node} cannot reach {target} {_target_node(args.target_group)}: no address from it in "
              f"{args.address_wait:.0f} s (its own line here says why; none: its check did not start)")
    elif reason := reach_problem(published[0], args.token, node):
        found(f"node {node} cannot reach {target} {published[1]} at {published[0]}: {reason}: {NETWORK_FIX}")
    return not problems


def source_problem(node: str, role: str, trial_dir: str, *, in_container: bool) -> str | None:
    """This node's rlkit against the one that validated the job at submit (rlkit.source_id, written in the trial
    directory): other code would read the config otherwise. None when they agree, or for a trial submitted before
    the id was recorded."""
    path = TrialPaths(Path(trial_dir)).source_id
    try:
        if not path.is_file():  # absent, or not a file submit wrote (a FIFO would hold the read)
            return None if not path.exists() else f"node {node}: {path} is not a file (submit writes it)"
        with open(path, encoding="utf-8", errors="replace") as f:
            expected = f.read(64).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"node {node} cannot read the job's rlkit source id in {trial_dir}: {exc.strerror or exc}"
    own = source_id()
    if own == expected:
        return None
    fix = (f"rebuild the {role} image from the rlkit that submits (`rlkit image build` in its checkout), or submit "
           "with the rlkit the image holds" if in_container else
           "install the submitting rlkit where launcher.python points (bash scripts/install.sh DIR from its "
           "checkout, or pip install it there), or submit with the rlkit that python runs")
    return (f"node {node} ({role}) runs {describe()}, not the rlkit that validated this job at submit (source "
            f"{expected}): its steps would read the config with other code; {fix}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rlkit.steps.node_check", description=__doc__.split("\n")[0])
    parser.add_argument("--role", required=True, help="this component's role (for the report)")
    parser.add_argument("--gpus", type=int, required=True, help="the GPUs per node this component asked for")
    parser.add_argument("--container", action="store_true", help="running inside the component's image")
    parser.add_argument("--listen", type=int, help="on the work component: how many other nodes connect to its "
                                                   "first node")
    parser.add_argument("--target-group", type=int, help="the work component's het group (whom to reach)")
    parser.add_argument("--target-role", default="trainer")
    parser.add_argument("--canary", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--writer", required=True, help="the node the batch script runs on")
    parser.add_argument("--address-file", required=True, help="where the batch script puts the first node's address")
    parser.add_argument("--address-wait", type=float, default=ADDRESS_WAIT_S, help="seconds to wait for it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    passed = run(parse_args(sys.argv[1:] if argv is None else argv),
                 report=lambda problem: print(f"rlkit: {problem}", flush=True),
                 publish=lambda line: print(line, flush=True))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

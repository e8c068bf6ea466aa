"""torch.distributed set-up from the Slurm step environment (or torchrun's), NCCL on GPUs and gloo on the CPU.

Inside `srun [--het-group=1] --ntasks=N python -m rlkit train`, each task is one rank (rlkit.slurm.jobenv.JobEnv: its
global rank, the step's world size, its local rank). Rank 0 picks a free port on its own host and
publishes `host:port` in the trial's name resolve under trainer/master/<job>.<step> (so there is no guessed port to
collide, and node names need not resolve: the host is what the servers advertise too); the other ranks wait for it.
An environment that already has RANK/WORLD_SIZE (torchrun, tests) is used as it is.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from rlkit.errors import StepError
from rlkit.nameresolve.base import NameResolve
from rlkit.nameresolve.servers import check_address
from rlkit.slurm.jobenv import JobEnv, advertised_host

_joined = False  # set once this process joins a process group
_rank0_waits: dist.ProcessGroup | None = None  # broadcast_object's group, when init_distributed got rank0_wait_s
_rank0_wait_s: float | None = None  # how long the other ranks wait for rank 0 working alone, named when it passes
COLLECTIVE_TIMEOUT_S = 1800.0  # how long a collective waits for a rank stuck while its process lives (a GPU kernel)
OVERDUE_MARGIN_S = 60.0  # rank 0's group times out this long after rank0_wait_s: the named deadline comes first
_sp: SequenceParallel | None = None  # the Ulysses layout, once an engine with ulysses_sp_size > 1 asked for it


@dataclass(frozen=True)
class TrainerWaits:
    """How long the trainer's collectives wait (`collective_s`: for a rank stuck while its process lives, and at least
    as long as rank 0 may spend between two steps of a collective run, e.g. one bucket of a broadcast push), and how
    long the other ranks wait for rank 0's broadcasts (`rank0_s`: see `init_distributed`)."""

    collective_s: float = COLLECTIVE_TIMEOUT_S
    rank0_s: float | None = None


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def dist_env_from(environ: dict[str, str] | os._Environ[str]) -> DistEnv:
    """The rank layout from torchrun-style variables, else from Slurm's (address still empty), else one process."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return DistEnv(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", "0")),
                       environ.get("MASTER_ADDR", "127.0.0.1"), int(environ.get("MASTER_PORT", "29500")))
    job = JobEnv.from_environ(environ)
    if job.in_step:
        return DistEnv(job.global_rank, job.world_size, job.local_rank, "", 0)
    return DistEnv(0, 1, 0, "127.0.0.1", int(environ.get("MASTER_PORT", "29500")))


def rendezvous_key(environ: dict[str, str] | os._Environ[str]) -> str:
    job = JobEnv.from_environ(environ)
    return f"trainer/master/{job.job_id or '0'}.{job.step_id or '0'}"


def rendezvous(env: DistEnv, nr: NameResolve, key: str, timeout_s: float) -> DistEnv:
    """Fill in the master address: rank 0 publishes host:port under `key`, the others wait for it."""
    from rlkit.servers.health import find_free_port

    if env.rank == 0:
        host = advertised_host()
        port = find_free_port("0.0.0.0")
        nr.add(key, f"{host}:{port}", replace=True)
    else:
        published = nr.wait(key, timeout=timeout_s)
        try:
            host, _, port_text = check_address(published).rpartition(":")
        except ValueError as e:
            raise StepError(f"the trainer's rank 0 published {key!r} as {published!r}, not host:port ({e}) in "
                            f"{nr.describe_location()}") from None
        port = int(port_text)
    return DistEnv(env.rank, env.world_size, env.local_rank, host, port)


def init_distributed(nr: NameResolve | None = None, timeout_s: float = COLLECTIVE_TIMEOUT_S, *,
                     rank0_wait_s: float | None = None) -> tuple[DistEnv, torch.device]:
    """Join the process group (NCCL with CUDA, else gloo) and return the layout and this rank's device.

    `rank0_wait_s`: how long rank 0 may work alone between two of its broadcasts (`broadcast_object`: a batch of
    rollouts, a checkpoint decision), its own deadlines added up: those broadcasts then go through a group of that
    timeout (and OVERDUE_MARGIN_S), so the other ranks wait for rank 0 as long as its config lets it work (a slow
    rollout, a checkpoint written to a slow filesystem) instead of failing first with torch's timeout, which names
    nothing; a wait that says what rank 0 does (`rank0_doing`) names it when rank0_wait_s passes. The
    group has the world's backend: NCCL on GPUs, as every collective there before it (a gloo group across GPU nodes
    would need GLOO_SOCKET_IFNAME wherever a node's host name resolves to a loopback address locally)."""
    env = dist_env_from(os.environ)
    published = None
    if not env.master_addr:
        if nr is None:
            raise RuntimeError("a Slurm step needs name resolve to find the trainer's rank 0")
        published = rendezvous_key(os.environ)
        env = rendezvous(env, nr, published, timeout_s=600.0)
    os.environ.update(RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                      MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port))
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    global _joined, _rank0_waits, _rank0_wait_s
    _joined = True
    if rank0_wait_s is not None and env.world_size > 1:
        _rank0_wait_s = rank0_wait_s
        _rank0_waits = dist.new_group(backend=backend,
                                      timeout=datetime.timedelta(seconds=rank0_wait_s + OVERDUE_MARGIN_S))
    if published is not None and nr is not None:
        dist.barrier()  # everyone has joined: the address is no longer needed
        if env.rank == 0:
            nr.delete(published)
    return env, device


@dataclass(frozen=True)
class SequenceParallel:
    """The 2-D layout FSDP x SP (issue 46, part 4): ranks [k*sp, (k+1)*sp) form sequence-parallel group k, which
    shares its samples (every rank of it holds the same micro-batches, each rank a slice of every packed row); the
    data-parallel degree is world / sp. FSDP still shards over every rank."""

    size: int
    group: dist.ProcessGroup  # this rank's sp group (the all-to-all of attention, the gather of log-probs)
    local_rank: int  # this rank's place in its sp group: which slice of a packed row it holds
    data_rank: int  # which share of a batch this rank's group trains
    data_world: int  # how many shares: world / sp


def init_sequence_parallel(size: int) -> SequenceParallel | None:
    """This process's sp layout for `size` (None for 1: nothing changes); collective on first use (the device mesh
    creates every group on every rank). One size per process: every engine's samples are dealt the same way."""
    global _sp
    if size <= 1:
        if _sp is not None:
            raise RuntimeError(f"this trainer already runs ulysses_sp_size={_sp.size}; another model asks for 1")
        return None
    if _sp is not None:
        if _sp.size != size:
            raise RuntimeError(f"this trainer already runs ulysses_sp_size={_sp.size}; another model asks for {size}")
        return _sp
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world % size:
        raise RuntimeError(f"ulysses_sp_size={size} does not divide the trainer's {world} ranks")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (world // size, size), mesh_dim_names=("dp", "sp"))
    _sp = SequenceParallel(size, mesh["sp"].get_group(), mesh["sp"].get_local_rank(), mesh["dp"].get_local_rank(),
                           world // size)
    return _sp


def sequence_parallel() -> SequenceParallel | None:
    """The sp layout when sequence parallelism is on, else None."""
    return _sp


def data_rank_world(rank: int, world: int) -> tuple[int, int]:
    """(which share, how many shares) of a batch this rank trains: its sp group's under sequence parallelism (the
    ranks of a group hold the same samples), else (rank, world)."""
    return (rank, world) if _sp is None else (_sp.data_rank, _sp.data_world)


def joined_a_process_group() -> bool:
    """Whether this process ever joined a torch.distributed process group (it then ends with `end_process`)."""
    return _joined


def end_process(code: int) -> NoReturn:
    """End a process that used torch.distributed: atexit handlers and stdio flush run, interpreter teardown does not.

    `destroy_process_group()` only drops the group from torch's registry; FSDP2's device mesh keeps it alive, so its
    C++ destructor (which joins gloo's worker threads) would run while the interpreter is torn down, where it can
    abort the process ("terminate called without an active exception", SIGABRT: seen once in CI in the 2-rank gloo
    test). For a trainer step that would turn a finished run into a failed srun task, and the batch script would
    retry it. Everything the trainer writes is closed before this is called.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing left to save
            stream.flush()
    os._exit(code)


def broadcast_object(obj: object, src: int = 0, *, rank0_doing: str = "") -> object:
    """Send a picklable object from `src` to every rank (from rank 0: within `init_distributed`'s rank0_wait_s).

    `rank0_doing`: what rank 0 does alone before it sends ("write checkpoints/final"): a rank still waiting when
    rank0_wait_s passes says so and ends, on any backend (NCCL's own timeout aborts the process naming nothing)."""
    box = [obj]
    overdue = _overdue_timer(rank0_doing) if src == 0 and rank0_doing and dist.get_rank() != 0 else None
    try:
        dist.broadcast_object_list(box, src=src, group=_rank0_waits if src == 0 else None)
    finally:
        if overdue is not None:
            overdue.cancel()
    return box[0]


def _overdue_timer(doing: str) -> threading.Timer | None:
    """A started timer that ends this process naming what rank 0 was doing, once rank0_wait_s has passed."""
    bound = _rank0_wait_s
    if bound is None:
        return None
    started = time.monotonic()

    def overdue() -> None:
        print(f"rlkit train: rank {dist.get_rank()}: waited {time.monotonic() - started:.0f} s for trainer rank 0 to "
              f"{doing}, the longest it may work alone ({bound:g} s: saver.write_timeout and the job's own "
              "deadlines): it is stuck or far slower than its config allows; ending this step", flush=True)
        os._exit(1)

    timer = threading.Timer(bound, overdue)
    timer.daemon = True
    timer.start()
    return timer


def all_reduce_max(value: int) -> int:
    t = torch.tensor([value], dtype=torch.long)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sums over the ranks of per-share values (tokens, loss sums): under sequence parallelism every rank of an sp
    group holds the same share, so each share is counted once (divided by sp: exact for the power-of-two sizes)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if _sp is not None:
        t = t / _sp.size
    return [float(x) for x in t.tolist()]


def gather_per_sample(part: dict[int, list[float]] | None) -> dict[int, list[float]] | None:
    """Every rank's {global sample index: values} merged on every rank (None stays None); collective.

    The KL reward penalty needs the whole batch's old and reference log-probs before the advantages, while each
    rank computes only its own samples'.
    """
    if part is None:
        return None
    parts: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    merged: dict[int, list[float]] = {}
    for p in parts:
        merged.update(p)  # type: ignore[call-overload]
    return merged

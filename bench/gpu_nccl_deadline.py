"""The GPU checklist's item 5: the trainer's NCCL weight link (rlkit.servers.vllm.trainer_link) on a real GPU.

Run: `python bench/gpu_nccl_deadline.py --out DIR [--cases ...]` on a machine with one CUDA GPU. The GPU machine has
no vLLM, so the link's communicator is a real NCCL communicator made by CuPy's NCCL binding instead of vLLM's trainer
helper, behind the same calls (`broadcast(tensor, src=, stream=)`; `destroy()`: ncclCommAbort in a thread waited for
at most 5 s, as vLLM's; the one-element warm-up all-reduce vLLM's makes at init). One GPU holds one NCCL rank, so a
world of one. The cases:
  push            a bucket (bf16 and fp32 tensors, packed into byte chunks as on NCCL) goes out on the link's own
                  stream, its completion seen by polling a CUDA event; the bytes arrive unchanged
  stuck_link      after a normal send, a kernel that runs 8x the deadline is queued on the link's stream (a stuck
                  broadcast as a dead peer leaves it): the next send must fail after the group's timeout, naming it
  stuck_timeline  stuck_link's send step by step, each host call timed (which of them waits for the device)
  stuck_current   the long kernel on the current stream before the first send (the bucket's packing is ordered
                  after it)
  alloc_probe     which host calls wait for a busy device (each timed beside a 3 s kernel)
  join            a group of two whose second rank never comes: the join must fail after the group's timeout
Each case runs in a process of its own (an aborted communicator or a thread blocked in C must not leak into the
next) and writes DIR/nccl-deadline.json. What one GPU cannot show: a peer dying mid-broadcast (a stuck NCCL kernel,
which an abort ends, unlike the sleeping kernel that stands in for it here). Measured on an H200
(bench/results/gpu-h200-nccl-deadline.json): with CUDA's default lazy module loading the first launch of a kernel
waits for the whole device, so the packing of a bucket hung the host behind the stall, outside every deadline;
with CUDA_MODULE_LOADING=EAGER (what rlkit's plan sets for a broadcasting trainer) the deadline fired.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TIMEOUT_S = 2.0  # the group's deadline in the failing cases
CASES = ("push", "stuck_link", "stuck_timeline", "stuck_current", "alloc_probe", "join")
BROADCAST_HOST_S: list[float] = []  # the host's time inside each broadcast call (enqueueing it, not running it)
ABORTS: list[dict[str, Any]] = []  # each abort of the case's communicator: how long it took, whether it returned


class CupyComm:
    """A real NCCL communicator (CuPy's binding) with the two calls the link makes on vLLM's PyNcclCommunicator."""

    def __init__(self, world_size: int, rank: int, warm_up: bool = True) -> None:
        """`warm_up`: as vLLM's communicator, a one-element all-reduce on the current stream, synchronized, right
        after ncclCommInitRank (NCCL connects its channels at a communicator's first collective)."""
        import torch
        from cupy.cuda import nccl

        self.nccl = nccl
        self.comm = nccl.NcclCommunicator(world_size, nccl.get_unique_id(), rank)
        if warm_up:
            one = torch.zeros(1, device="cuda")
            stream = torch.cuda.current_stream()
            self.comm.allReduce(one.data_ptr(), one.data_ptr(), 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                stream.cuda_stream)
            stream.synchronize()

    def broadcast(self, tensor: Any, src: int, stream: Any) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        started = time.monotonic()
        self.comm.bcast(tensor.data_ptr(), nbytes, self.nccl.NCCL_UINT8, src, stream.cuda_stream)
        BROADCAST_HOST_S.append(round(time.monotonic() - started, 4))

    def destroy(self) -> None:
        """As vLLM's PyNcclCommunicator.destroy: the abort in a thread of its own, waited for at most 5 s."""
        import threading

        started = time.monotonic()
        aborting = threading.Thread(target=self.comm.abort, daemon=True)
        aborting.start()
        aborting.join(timeout=5.0)
        ABORTS.append({"seconds": round(time.monotonic() - started, 3), "returned": not aborting.is_alive()})


def group(world_size: int, timeout_s: float) -> Any:
    from rlkit.servers.backend import WeightGroup

    return WeightGroup(master_address="127.0.0.1", master_port=0, rank_offset=1, world_size=world_size,
                       group_name="gpu-check", backend="nccl", timeout_s=timeout_s)


def sleep_cycles_per_s() -> float:
    """torch.cuda._sleep's cycles per second on this GPU, timed with CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm-up
    cycles = 200_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000)


def bucket() -> list[Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g),  # 32 MiB
            torch.randn(1536, device="cuda", dtype=torch.float32, generator=g),
            torch.randn(8960, 1536, device="cuda", dtype=torch.bfloat16, generator=g)]


def case_push() -> dict[str, Any]:
    import torch

    from rlkit.servers.vllm.trainer_link import VllmWeightLink

    link = VllmWeightLink(group(1, 60.0), nccl_join=lambda rendezvous: CupyComm(rendezvous["world_size"], 0))
    tensors = bucket()
    before = [t.clone() for t in tensors]
    link.send(tensors)  # warm-up (NCCL's first collective sets up its channels)
    started = time.monotonic()
    rounds = 20
    for _ in range(rounds):
        link.send(tensors)
    seconds = (time.monotonic() - started) / rounds
    torch.cuda.synchronize()
    unchanged = all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    link.close()
    return {"ok": unchanged, "packed": link.packed, "bucket_bytes": nbytes, "seconds_per_bucket": round(seconds, 5),
            "bytes_unchanged": unchanged}


def send_timed(link: Any, tensors: list[Any]) -> dict[str, float]:
    """`link.send`, step by step (rlkit.servers.vllm.trainer_link), with the host's time in each step."""
    from rlkit.servers.vllm import trainer_link

    phases: dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - clock, 4)
        clock = now

    payload = trainer_link._payload(tensors, link.packed)
    lap("payload")
    handles = []
    for tensor in payload:
        handles.append(link._end.start(tensor))
        lap("start")
    for handle in handles:
        link._end.wait(handle)
        lap("wait")
    return phases


def case_stuck(on_link_stream: bool) -> dict[str, Any]:
    """A kernel that runs far past the deadline, queued before the bucket's broadcast: on the link's own stream
    after a first, normal send (`on_link_stream`: a stuck broadcast as a dead peer leaves it; the packing buffers are
    cached by then), or on the current stream before the first send (the packing of the bucket must allocate)."""
    import torch

    from rlkit.servers.deadline import DeadlineExceeded
    from rlkit.servers.vllm.trainer_link import VllmWeightLink

    rate = sleep_cycles_per_s()
    link = VllmWeightLink(group(1, TIMEOUT_S), nccl_join=lambda rendezvous: CupyComm(rendezvous["world_size"], 0))
    tensors = bucket()
    stall_s = 8 * TIMEOUT_S
    if on_link_stream:
        link.send(tensors)
        with torch.cuda.stream(link._end.stream):
            torch.cuda._sleep(int(rate * stall_s))
    else:
        torch.cuda._sleep(int(rate * stall_s))  # the link's stream waits for the current one
    started = time.monotonic()
    error = ""
    phases: dict[str, float] = {}
    try:
        phases = send_timed(link, tensors)
    except DeadlineExceeded as exc:
        error = str(exc)
    failed_after = time.monotonic() - started
    result: dict[str, Any] = {"stall_s": stall_s, "timeout_s": TIMEOUT_S, "failed_after_s": round(failed_after, 3),
                              "error": error, "aborts": ABORTS, "broadcast_host_s": BROADCAST_HOST_S,
                              "host_phases_s": phases}
    try:  # what the device does with the broadcast queued behind the stall on an aborted communicator
        torch.cuda.synchronize()
        result["device_after_abort"] = "synchronized without error"
    except Exception as exc:
        result["device_after_abort"] = f"{type(exc).__name__}: {exc}"[:400]
    # the deadline fired and named the group. failed_after also holds what came after the error until this clock read
    # (16 s on the H200 against 7.0 s in stuck_timeline, which reads it at once): it waited for the stalled stream,
    # the abort not yet returned; which call waited is not pinned down
    result["ok"] = bool(error) and "gpu-check" in error
    return result


def case_stuck_timeline() -> dict[str, Any]:
    """stuck_link's push, the link's steps done here one by one (as rlkit.servers.vllm.trainer_link._Nccl does
    them), each host call timed: which of them waits for the stalled stream."""
    import torch

    from rlkit.servers import deadline
    from rlkit.servers.vllm import trainer_link
    from rlkit.servers.vllm.trainer_link import VllmWeightLink

    rate = sleep_cycles_per_s()
    link = VllmWeightLink(group(1, TIMEOUT_S), nccl_join=lambda rendezvous: CupyComm(rendezvous["world_size"], 0))
    end = link._end
    tensors = bucket()
    link.send(tensors)
    with torch.cuda.stream(end.stream):
        torch.cuda._sleep(int(rate * 8 * TIMEOUT_S))
    began = time.monotonic()
    marks: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        marks.append((name, round(time.monotonic() - began, 4)))

    payload = trainer_link._payload(tensors, link.packed)
    mark("payload")
    current = torch.cuda.current_stream()
    ready = torch.cuda.Event()
    mark("Event()")
    ready.record(current)
    mark("ready.record(current)")
    end.stream.wait_event(ready)
    mark("stream.wait_event")
    end.stream.wait_stream(current)
    mark("stream.wait_stream")
    end.comm.broadcast(payload[0], src=0, stream=end.stream)
    mark("broadcast")
    payload[0].record_stream(end.stream)
    mark("record_stream")
    done = torch.cuda.Event()
    done.record(end.stream)
    mark("done.record(link stream)")
    polls: list[float] = []

    def query() -> bool:
        started = time.monotonic()
        answer = done.query()
        polls.append(time.monotonic() - started)
        return bool(answer)

    def close() -> None:
        mark("expired: abort starts")
        end.close()
        mark("abort returned")

    try:
        deadline.wait_until(query, TIMEOUT_S, "the stalled broadcast", on_expiry=close)
        mark("done without expiry")
    except deadline.DeadlineExceeded:
        mark("DeadlineExceeded caught")
    return {"ok": True, "marks_s": marks, "aborts": ABORTS, "polls": len(polls),
            "slowest_poll_s": round(max(polls, default=0.0), 4)}


def case_alloc_probe() -> dict[str, Any]:
    """Which host calls wait for a busy device: each timed while a 3 s kernel runs on the current stream."""
    import torch

    rate = sleep_cycles_per_s()
    small = [torch.ones(1024, device="cuda", dtype=torch.uint8) for _ in range(3)]
    big = [torch.ones(20 << 20, device="cuda", dtype=torch.uint8) for _ in range(3)]
    torch.cuda.synchronize()
    probes: dict[str, Any] = {
        "new 64 MiB block (torch.empty)": lambda: torch.empty(64 << 20, device="cuda", dtype=torch.uint8),
        "torch.cat of 3 x 1 KiB": lambda: torch.cat(small),
        "torch.cat of 3 x 20 MiB": lambda: torch.cat(big),
        "torch.cat of 3 x 20 MiB again (cached block)": lambda: torch.cat(big),
        "new stream + event record": lambda: torch.cuda.Event().record(torch.cuda.Stream()),
    }
    seconds: dict[str, float] = {}
    for name, probe in probes.items():
        torch.cuda._sleep(int(rate * 3.0))
        started = time.monotonic()
        kept = probe()
        seconds[name] = round(time.monotonic() - started, 4)
        del kept
        torch.cuda.synchronize()
    return {"ok": True, "host_s_while_device_busy_3s": seconds}


def case_join() -> dict[str, Any]:
    import torch  # imported before the clock starts, as in a trainer

    from rlkit.servers.deadline import DeadlineExceeded
    from rlkit.servers.vllm.trainer_link import VllmWeightLink

    torch.cuda.init()
    started = time.monotonic()
    error = ""
    try:
        VllmWeightLink(group(2, TIMEOUT_S), nccl_join=lambda rendezvous: CupyComm(rendezvous["world_size"], 0))
    except DeadlineExceeded as exc:
        error = str(exc)
    failed_after = time.monotonic() - started
    return {"ok": bool(error) and failed_after < TIMEOUT_S + 2.0, "timeout_s": TIMEOUT_S,
            "failed_after_s": round(failed_after, 3), "error": error}


def run_case(name: str) -> None:
    """In the child: one case, its result as the last line of stdout; then exit at once (a thread blocked in
    ncclCommInitRank, or an aborted communicator, would hold up a normal interpreter exit)."""
    try:
        result = {"push": case_push, "stuck_link": lambda: case_stuck(on_link_stream=True),
                  "stuck_current": lambda: case_stuck(on_link_stream=False), "alloc_probe": case_alloc_probe,
                  "stuck_timeline": case_stuck_timeline,
                  "join": case_join}[name]()
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()[-2000:]}
    print(json.dumps(result), flush=True)
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # the child's part
    parser.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES), help="the cases to run")
    args = parser.parse_args()
    if args.case:
        run_case(args.case)
    if args.out is None:
        parser.error("--out DIR is required")
    results: dict[str, Any] = {}
    for name in args.cases:
        started = time.monotonic()
        try:
            child = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True,
                                   timeout=120, check=False)
            lines = child.stdout.strip().splitlines()
            results[name] = json.loads(lines[-1]) if lines else {"ok": False, "error": child.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            results[name] = {"ok": False, "error": "the case itself hung past 120 s"}
        results[name]["wall_s"] = round(time.monotonic() - started, 2)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl-deadline.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

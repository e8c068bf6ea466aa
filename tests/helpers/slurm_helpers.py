"""Test helpers (not a conftest) for jobs on the dev cluster: poll `rlkit status`, find leftover processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from tests.conftest import run_rlkit

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}
# what squeue may list for a job that has not ended: ACTIVE and the passing states of a requeue, signal or suspend
SLURM_ACTIVE = ACTIVE | {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "SUSPENDED"}


def status_row(name: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = run_rlkit("status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return next(r for r in json.loads(result.stdout) if r["name"] == name)


def _slurm_lists_active(job_id: str) -> bool:
    """Whether `squeue` still lists a component of job `job_id` as active (a requeue counts as active)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                         check=False)
    return out.returncode == 0 and any(state in SLURM_ACTIVE for state in out.stdout.split())


def job_ids_named(prefix: str) -> set[str]:
    """Ids of the jobs (any state) whose name starts with `prefix`: a test's own, while other tests' trials come and
    go in the same queue."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %j"], capture_output=True, text=True,
                         check=True).stdout
    return {fields[0] for fields in map(str.split, out.splitlines()) if fields[1:2] and fields[1].startswith(prefix)}


def job_ids_under(path: Path) -> set[str]:
    """Ids of the jobs (any state) whose batch script lies under `path` (a test's tmp_path: its own jobs only, while
    other tests' jobs of the same experiment come and go in the same queue)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%o"], capture_output=True, text=True,
                         check=True).stdout
    root = str(path).rstrip("/") + "/"
    return {job for job, _, script in (line.partition("|") for line in out.splitlines()) if script.startswith(root)}


def wait_state(name: str, done: set[str] | None = None, timeout: float = 900,
               env: dict[str, str] | None = None, trial: Path | None = None) -> str:
    """Poll until the job is no longer active (or reaches one of `done`), as `rlkit status` reports it.

    `rlkit status` decides, but it is a Python start (~0.35 s of CPU): while Slurm lists the job active, `squeue`
    alone (a few ms) paces the wait, and `rlkit status` is asked again once it does not (a stage run's next job, a
    requeue's new attempt: the status row names the job to follow). Polled every 2 s, the test process's CLI calls
    (mostly these) took 270 s of CPU in a run's first 20 minutes. A timeout explains itself as wait_for's does."""
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        row = status_row(name, env)
        state = str(row["state"])
        if (done and state in done) or (not done and state not in ACTIVE):
            return state
        time.sleep(2)
        job_id = str(row.get("job_id") or "")
        while not done and job_id.isdigit() and time.monotonic() < deadline and _slurm_lists_active(job_id):
            time.sleep(2)
    raise AssertionError(f"{name} still {state} after {timeout} s\n{cluster_picture(trial)}")


def wait_for(predicate, what: str, timeout: float = 300, every: float = 1.0,  # type: ignore[no-untyped-def]
             trial: Path | None = None):
    """Poll `predicate` every `every` seconds until it returns a true value (returned). A predicate that starts a
    Python process (`rlkit status`) takes every=5: the trial it waits for needs the CPU more than the poll. With
    `trial`, the wait ends as soon as the trial's job has ended (its script wrote job_end since the wait began), and
    its error carries the queue, the nodes and the end of the trial's logs: CI shows only that message."""
    began, deadline = time.time(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if trial is not None and _job_ended_since(trial, began):
            if value := predicate():  # it may have come true just before the end
                return value
            raise AssertionError(f"the trial's job ended while waiting for {what}\n{cluster_picture(trial)}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{cluster_picture(trial)}")


def _job_ended_since(trial: Path, since: float) -> bool:
    """Whether the trial's batch script wrote its end record (job_end: not on a requeue) at or after `since`."""
    try:
        return (trial / "job_end").stat().st_mtime >= since
    except OSError:
        return False


def _command_output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({' '.join(argv[:2])}: {exc})"
    return (done.stdout + done.stderr).strip()


# what vLLM's and SGLang's processes print at exit about leaked nanobind objects (~30 lines): it would fill a log's
# tail and hide the lines that explain the end ("engine core exited unexpectedly")
_EXIT_NOISE = re.compile(r"nanobind: |See https://nanobind|\s+- (leaked |\.\.\. skipped remainder)")


def cluster_picture(trial: Path | None = None, log_lines: int = 12) -> str:
    """What a timed-out wait needs to be explained from CI's output alone: every job in the queue with its state and
    pending reason, every node's state and drain reason, and the trial's live processes and the end of its logs."""
    parts = ["squeue:\n" + _command_output(["squeue", "-h", "-t", "all", "-o", "%i %j %T %r %M %N"]),
             "sinfo:\n" + _command_output(["sinfo", "-h", "-N", "-o", "%N %T %E"])]
    if trial is not None:
        parts.append("processes of the trial:\n" + "\n".join(processes_mentioning(str(trial))[:12]))
    logs = sorted((trial / "logs").glob("*")) if trial is not None and (trial / "logs").is_dir() else []
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()
            tail = [line for line in lines if not _EXIT_NOISE.match(line)][-log_lines:]
        except OSError as exc:
            tail = [str(exc)]
        parts.append(f"{log.name} (last {log_lines} lines):\n" + "\n".join(tail))
    return "\n".join(parts)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (this test process excluded)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def server_step_pids(trial: Path, index: int) -> list[int]:
    """Every process of the trial's server `index`: its `rlkit serve` process (not the srun that started it) and
    everything under it (the engine's API server, its engine process), found through /proc."""
    parents: dict[int, int] = {}
    roots = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        args = [arg for arg in cmd if arg]
        if (b"serve" in args and str(trial).encode() in args and args[-2:] == [b"--index", str(index).encode()]
                and b"srun" not in args[0]):
            roots.append(int(proc.name))
    found = set(roots)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return sorted(found)
        found |= more


def trained_steps(trial: Path) -> int:
    """The last step the trial's trainer reported in progress.json (0 before the first)."""
    try:
        return int(json.loads((trial / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def trainer_rank_pid(trial: Path, rank: int = 0) -> int | None:
    """The python process of trainer rank `rank` (0 unless given) of this trial (not its srun)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"train" in cmd and str(trial).encode() in cmd and f"SLURM_PROCID={rank}".encode() in environ
                and b"srun" not in cmd[0]):
            return int(proc.name)
    return None


def signal_pending(pid: int, signum: int) -> bool:
    """Whether `signum` waits, undelivered, for process `pid` (a stopped process keeps what it is sent pending):
    the process-wide (ShdPnd) or thread (SigPnd) mask of /proc/PID/status."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = re.findall(r"^(?:ShdPnd|SigPnd):\s*([0-9a-f]+)$", status, re.M)
    return any(int(mask, 16) >> (signum - 1) & 1 for mask in masks)


def assert_every_version_fingerprinted(trainer_log: str, servers: list[int], last_version: int) -> None:
    """The trainer log shows every weight version from 0 to `last_version` read back from exactly `servers` and
    within the fingerprint tolerance of the demo configs (1e-3: float32 on both sides)."""
    for version in range(0, last_version + 1):
        match = re.search(rf"servers {re.escape(str(servers))} at weight version {version}, fingerprint max "
                          rf"\|dlogp\| (\S+) \(tolerance (\S+)\)", trainer_log)
        assert match, f"no verified sync to version {version} in the trainer log"
        assert float(match.group(1)) <= float(match.group(2)) == 1e-3

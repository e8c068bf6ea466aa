"""Thin wrappers around Slurm's commands (the only module that runs them) and the parsing of their output.

Works without accounting: job state comes from `scontrol show job` (and `squeue`), and `sacct` is asked only
when the controller has already forgotten the job.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rlkit.errors import SlurmError, UserError

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job (for a heterogeneous job: its leader, with each component's state)."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: str = ""
    elapsed: str = ""
    nodes: str = ""
    components: tuple[tuple[str, str, str], ...] = ()  # (component id, state, nodes)
    # each component's own job id (`<id>+<k>` addresses the whole job in scancel; this id only component k)
    component_job_ids: tuple[str, ...] = ()
    name: str = ""  # JobName and StdOut (%j expanded), as the controller has them: what tells whose job it is
    stdout: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def _run(argv: list[str], *, stdin: str | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"'{argv[0]}' is not on PATH: run rlkit on a Slurm login node (or start slurm/devcluster.sh)")
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"'{' '.join(argv)}' did not answer within {timeout:.0f} s (is slurmctld up?)") from None


def run_readonly(argv: list[str]) -> str | None:
    """The output of a Slurm query that changes nothing (scontrol show ...); None when it fails."""
    proc = _run(argv)
    return proc.stdout if proc.returncode == 0 else None


def sbatch_test_only(script: str) -> str:
    """Ask the controller whether it would accept the script, without submitting; raise UserError if not."""
    proc = _run(["sbatch", "--test-only"], stdin=script)
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().replace("sbatch: error: ", "")
        raise UserError(f"Slurm rejects this job: {message}",
                        hint="check launcher.slurm.{partition,account,qos,time,constraint,nodelist} and the layout")
    return (proc.stderr or proc.stdout).strip()


def sbatch(script_path: str, *, after_ok: str = "") -> str:
    """Submit a batch script; return the job id. `after_ok`: a job that must end successfully first (the previous
    stage of a multi-stage run); if it fails or is cancelled, Slurm cancels this one too (--kill-on-invalid-dep)
    instead of leaving it pending forever."""
    dependency = [f"--dependency=afterok:{after_ok}", "--kill-on-invalid-dep=yes"] if after_ok else []
    proc = _run(["sbatch", "--parsable", *dependency, script_path])
    if proc.returncode != 0:
        raise SlurmError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


def scancel(job_id: str) -> None:
    """Cancel a job (every component and step)."""
    proc = _run(["scancel", job_id])
    if proc.returncode != 0 and "already completing or completed" not in proc.stderr:
        raise SlurmError(f"scancel {job_id} failed: {proc.stderr.strip()}")


def signal_steps(job: str, signal_name: str) -> None:
    """Send a signal to the running steps of a job or het component (`123+1`), not to its batch script."""
    proc = _run(["scancel", f"--signal={signal_name}", job])
    if proc.returncode != 0:
        raise SlurmError(f"scancel --signal={signal_name} {job} failed: {proc.stderr.strip()}")


def step_ids(job_id: str, name: str, *, tries: int = 3) -> list[str]:
    """The ids (`JOB.STEP`) of the job's running steps called `name` (srun --job-name), from squeue. A busy
    controller's failed answer (a socket time-out) is asked again, `tries` times a second apart, then raised: an
    empty list means no such step runs, never that squeue could not tell."""
    argv = ["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"]
    for attempt in range(tries):
        proc = _run(argv)
        if proc.returncode == 0:
            return [parts[0] for parts in (line.split(maxsplit=1) for line in proc.stdout.splitlines())
                    if len(parts) == 2 and parts[1].strip() == name]
        if attempt + 1 < tries:
            time.sleep(1.0)
    raise SlurmError(f"squeue could not list the steps of job {job_id} ({tries} tries): "
                     f"{(proc.stderr or proc.stdout).strip()}")


# Fields `scontrol show job` (without -o) prints alone on their line: there a value with spaces (a path under a
# fileroot holding one) is whole, where the one-line form (-o) cannot tell it from the next Key=Value pair
WHOLE_LINE_KEYS = frozenset({"Command", "WorkDir", "StdErr", "StdIn", "StdOut"})


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ...` records of either form: one-line (-o), one record per line of space-separated Key=Value
    pairs; or the default, a record's first line unindented and the rest indented, where a WHOLE_LINE_KEYS value is
    the rest of its line, spaces and all. A record starts at each unindented line."""
    records: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() or not records:
            records.append({})
        record = records[-1]
        key, sep, value = line.lstrip().partition("=")
        if sep and key in WHOLE_LINE_KEYS and line[0].isspace():
            record[key] = value
            continue
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
    return records


def job_info_from_records(job_id: str, records: list[dict[str, str]]) -> JobInfo:
    """Combine the component records of a (heterogeneous) job into one JobInfo led by component 0."""
    records = sorted(records, key=lambda r: int(r.get("HetJobOffset", "0")))
    leader = records[0]
    components = tuple(
        (f"{job_id}+{r['HetJobOffset']}" if "HetJobOffset" in r else job_id, r.get("JobState", "UNKNOWN"),
         r.get("NodeList", ""))
        for r in records
    )
    return JobInfo(
        job_id=job_id, state=leader.get("JobState", "UNKNOWN"), reason=leader.get("Reason", ""),
        exit_code=leader.get("ExitCode", ""), elapsed=leader.get("RunTime", ""),
        nodes=",".join(c[2] for c in components if c[2] and c[2] != "(null)"), components=components,
        component_job_ids=tuple(r.get("JobId", job_id) for r in records),
        name=leader.get("JobName", ""), stdout=leader.get("StdOut", ""),
    )


FORGOTTEN_JOB = "Invalid job id specified"  # scontrol's words for a job id the controller does not know (any more)


def job_info(job_id: str, trial_dir: str | Path | None = None) -> JobInfo:
    """The job's state from the controller; from sacct when the controller forgot it; else from the end record the
    job's script wrote in `trial_dir` as it exited; else state UNKNOWN. Whose job the id names now is not checked
    here (trials_job_info does)."""
    proc = _run(["scontrol", "show", "job", job_id])  # not -o: its StdOut would be cut at a space (WHOLE_LINE_KEYS)
    if proc.returncode == 0 and proc.stdout.strip():
        return job_info_from_records(job_id, parse_scontrol_records(proc.stdout))
    if proc.returncode != 0 and FORGOTTEN_JOB not in proc.stderr:
        # the controller did not answer (down, a broken slurm.conf): a running job is not one Slurm forgot, and
        # `rlkit stop` said "has already ended; nothing to cancel" of it, exit 0, the job left running
        said = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
        raise SlurmError(f"scontrol show job {job_id} failed: {said} (is slurmctld up? `scontrol ping` says)")
    if accounted := _sacct_records(job_id):
        return accounted[0]
    if trial_dir is not None and (end := _script_end(job_id, trial_dir)) is not None:
        return replace(end, reason=f"{end.reason}; Slurm no longer knows the job, the state is its script's record")
    return JobInfo(job_id=job_id, state="UNKNOWN", reason="the controller no longer knows the job and sacct is off")


def _sacct_records(job_id: str, *, duplicates: bool = False) -> list[JobInfo]:
    """sacct's records of the job (-X: the allocation, one per het component): the newest job that had the id, or
    with `duplicates` every one (Slurm reuses ids; `sacct -j` alone lists the most recent). [] without accounting."""
    if not shutil.which("sacct"):
        return []
    acct = _run(["sacct", "-n", "-X", "-P", *(["--duplicates"] if duplicates else []), "-j", job_id,
                 "-o", "JobID,State,ExitCode,Elapsed,NodeList,JobName"])
    if acct.returncode != 0:
        return []
    fields = [line.split("|", 5) for line in acct.stdout.splitlines() if line.strip()]
    return [JobInfo(job_id=job_id, state=(f[1].split() or ["UNKNOWN"])[0], exit_code=f[2], elapsed=f[3],
                    nodes=f[4], name=f[5]) for f in fields if len(f) == 6]


def _script_end(job_id: str, trial_dir: str | Path) -> JobInfo | None:
    """The state the job's script recorded in the trial directory as it exited (rlkit.step_contract.JOB_END)."""
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import read_job_end

    end = read_job_end(TrialPaths(Path(trial_dir)), job_id)
    if end is None:
        return None
    ended = time.strftime("%Y-%m-%d %H:%M", time.localtime(end.ended_at))
    return JobInfo(job_id=job_id, state=end.state, exit_code=f"{end.exit_code}:0", reason=f"ended {ended}")


def trials_job_info(job_id: str, experiment: str, trial: str, trial_dir: str | Path) -> JobInfo:
    """The state of the job the trial submitted as `job_id`, never of another job that has the id now (Slurm reuses
    ids: a wrapped MaxJobId, a controller whose state was reset). When Slurm's answer is another job's
    (is_trials_job), the trial's job has ended (a controller gives an id to one job at a time, and sacct -j answers
    with the newest), and its state is accounting's record of it (sacct --duplicates, by name), else its script's end
    record, else UNKNOWN; the reason says the id is another job's now."""
    info = job_info(job_id, trial_dir)
    if is_trials_job(info, experiment, trial, trial_dir):
        return info
    taken = f"Slurm's job {job_id} is another job now ({info.name or info.stdout})"
    # an active record of the trial's job beside a later job of its id is stale (a controller reset): not used
    own = [r for r in _sacct_records(job_id, duplicates=True) if r.name == f"{experiment}_{trial}" and not r.active]
    if own:
        return replace(own[0], reason=f"{taken}; the state is accounting's record of the trial's job")
    if (end := _script_end(job_id, trial_dir)) is not None:
        return replace(end, reason=f"{taken}; the trial's job {end.reason}, the state is its script's record")
    return JobInfo(job_id=job_id, state="UNKNOWN",
                   reason=f"{taken}; the trial's job has ended and left no record of its state")


def is_trials_job(info: JobInfo, experiment: str, trial: str, trial_dir: str | Path) -> bool:
    """Whether Slurm's answer for the trial's recorded job id may be the trial's job: not known to be another job,
    named as submit names it (rlkit.launch.plan) and writing its batch log into the trial's logs/, where Slurm said
    either. A name or log Slurm did not give (sacct answering for a busy controller, the script's end record) counts
    as the trial's."""
    from rlkit.trials.paths import TrialPaths

    expected_log = str(TrialPaths(Path(trial_dir)).batch_log).replace("%j", info.job_id)
    return info.name in ("", f"{experiment}_{trial}") and info.stdout in ("", expected_log)


def is_trials_active_job(info: JobInfo, experiment: str, trial: str, trial_dir: str | Path) -> bool:
    """Whether Slurm still runs (or holds pending) the job the trial submitted: active, and not known to be another
    job (is_trials_job), for Slurm reuses job ids and the recorded id alone may be a later, unrelated job of the user.
    A job that may be the trial's counts: a resume refused beside it is safer than two jobs writing one trial."""
    return info.active and is_trials_job(info, experiment, trial, trial_dir)

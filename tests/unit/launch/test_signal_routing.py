"""Where the trainer's signals go: `rlkit stop`'s USR2 (rlkit.launch.stop) and the job script's time-limit USR1
(rlkit/launch/supervisor.sh) reach the trainer's steps only, never a server's: a heterogeneous job's trainer is its
last component; in a job of one allocation (packed, or trainer only) the trainer is found by its step name in
squeue's listing and signalled by step id. Slurm's commands are stubs here that record their arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlkit.errors import SlurmError
from rlkit.launch import slurm
from rlkit.launch import stop as stop_module
from rlkit.launch.render import supervisor_body
from rlkit.launch.stop import _checkpoint_first, _signal_trainer
from rlkit.step_contract import STATUS_FINISHED, STATUS_STOPPED
from rlkit.trials.paths import TrialPaths
from tests.helpers.slurm_stubs import path_with, slurm_bin

LISTING = "1.0 server-0\n1.1 server-1\n1.2 grpo\n1.extern extern\n"  # squeue --steps --format='%i %j'


def stub_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, squeue_exit: int = 0) -> Path:
    """`squeue` (prints LISTING) and `scancel` executables first on PATH; each appends its arguments, one call a
    line, to calls.txt, which is returned."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    listing = tmp_path / "listing.txt"
    listing.write_text(LISTING)
    for name, then in (("squeue", f"cat {listing}; exit {squeue_exit}"), ("scancel", "exit 0")):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{then}\n')
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_step_ids_are_the_steps_of_that_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_slurm(tmp_path, monkeypatch)
    assert slurm.step_ids("1", "grpo") == ["1.2"]
    assert slurm.step_ids("1", "server-1") == ["1.1"]
    assert slurm.step_ids("1", "server") == [], "a name matches whole, not as a prefix"
    assert calls.read_text().splitlines()[0] == "squeue --noheader --steps --jobs=1 --format=%i %j"


def test_a_failed_squeue_is_asked_again_then_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy controller's time-out is no answer: "no trainer step" must never stand for "squeue could not tell"."""
    calls = stub_slurm(tmp_path, monkeypatch, squeue_exit=1)
    with pytest.raises(SlurmError, match="could not list the steps of job 1"):
        slurm.step_ids("1", "grpo", tries=2)
    assert calls.read_text().count("squeue") == 2
    stub_flaky = tmp_path / "bin" / "squeue"  # fails once, then answers
    stub_flaky.write_text(f'#!/bin/sh\necho "squeue $*" >> {calls}\n[ -e {tmp_path}/once ] && exec cat '
                          f'{tmp_path}/listing.txt\ntouch {tmp_path}/once; exit 1\n')
    assert slurm.step_ids("1", "grpo", tries=2) == ["1.2"]


def test_stop_signals_a_heterogeneous_job_s_last_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_slurm(tmp_path, monkeypatch)
    info = slurm.JobInfo("10", "RUNNING", component_job_ids=("10", "11", "12"))
    _signal_trainer("10", info, "grpo")
    assert calls.read_text().splitlines() == ["scancel --signal=USR2 12"], "no squeue: the component is the trainer"


def test_stop_signals_a_packed_job_s_trainer_step_by_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_slurm(tmp_path, monkeypatch)
    assert _signal_trainer("1", slurm.JobInfo("1", "RUNNING", component_job_ids=("1",)), "grpo")
    sent = [line for line in calls.read_text().splitlines() if line.startswith("scancel")]
    assert sent == ["scancel --signal=USR2 1.2"], "never the job (its servers' steps) nor a server step"


def test_no_trainer_step_listed_is_no_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_slurm(tmp_path, monkeypatch)
    (tmp_path / "listing.txt").write_text("1.0 server-0\n1.extern extern\n")
    assert not _signal_trainer("1", slurm.JobInfo("1", "RUNNING", component_job_ids=("1",)), "grpo")
    assert not [line for line in calls.read_text().splitlines() if line.startswith("scancel")]


def _stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, progress: dict[str, object], listed: bool,
          answer: str = "", ack: bool = False, job_ends_after: int = 0, timeout: float = 30,
          squeue_exit: int = 0) -> tuple[bool, list[str], list[str]]:
    """`_checkpoint_first` of a packed job whose squeue lists the trainer step when `listed`, whose trainer writes
    status `answer` (now) when it gets USR2 ("": it never answers) and, with `ack`, its stop_ack (its handler ran),
    and which Slurm reports ended from its `job_ends_after`-th poll on (0: never). Returns whether stop must still
    cancel, what it said and the scancels."""
    calls = stub_slurm(tmp_path, monkeypatch, squeue_exit=squeue_exit)
    trial = tmp_path / "trial"
    trial.mkdir()
    paths = TrialPaths(trial)
    paths.progress.write_text(json.dumps(progress))
    if not listed:
        (tmp_path / "listing.txt").write_text(LISTING.replace("1.2 grpo\n", ""))
    written = json.dumps({"status": answer, "step": 10, "updated": time.time() + 3600})
    paths.stop_ack.write_text("SIGUSR2 41 100.0\n")  # the attempt before's
    (tmp_path / "bin" / "scancel").write_text(
        f"#!/bin/sh\necho \"scancel $*\" >> {calls}\n" + (f"echo '{written}' > {paths.progress}\n" if answer else "")
        + (f"echo 'SIGUSR2 42 200.0' > {paths.stop_ack}\n" if ack else ""))
    polls = iter(range(1, 10_000))
    monkeypatch.setattr(slurm, "job_info", lambda job_id: slurm.JobInfo(
        job_id, "COMPLETED" if 0 < job_ends_after <= next(polls) else "RUNNING"))
    said: list[str] = []
    cancel = _checkpoint_first("1", "exp/t", slurm.JobInfo("1", "RUNNING", component_job_ids=("1",)), paths, "grpo",
                               timeout, said.append)
    return cancel, said, [line for line in calls.read_text().splitlines() if line.startswith("scancel")]


RUNNING = {"status": "running", "step": 9, "updated": 100.0}


def test_stop_waits_for_the_checkpoint_the_trainer_writes_after_the_signal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cancel, said, scancels = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, answer=STATUS_STOPPED)
    assert scancels == ["scancel --signal=USR2 1.2"] and cancel
    assert said[-1] == "the trainer checkpointed; rlkit resume continues from there"


def test_a_stopped_status_of_the_attempt_before_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a resume progress.json still says "stopped" (the last attempt's) until the first step ends: stop
    must not read it as this trainer's checkpoint and cancel it mid-step."""
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress={**RUNNING, "status": STATUS_STOPPED}, listed=True,
                            ack=True, timeout=2)
    assert cancel and said[-1] == "no checkpoint within 2 s; cancelling anyway (resume uses the last checkpoint)"


def test_a_trainer_that_cannot_answer_is_cancelled_without_waiting_for_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stop_ack after the signal (rank 0 stopped, hung, or in a collective with a hung rank): cancelled once the
    answer's deadline passed, not after the checkpoint's; the stop_ack of an attempt before is no answer."""
    monkeypatch.setattr(stop_module, "STOP_ANSWER_S", 1.0)
    started = time.monotonic()
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, timeout=60)
    assert cancel and time.monotonic() - started < 30
    assert said[-1].startswith("the trainer did not answer the signal within 1 s (a rank hung, stopped"), said


def test_a_trainer_that_fails_after_the_signal_is_cancelled_without_waiting_out_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It answered, then failed (e.g. a rank watch found another rank silent): nothing will checkpoint now."""
    failed = "failed: trainer rank 1 (pid 9 on node4) silent for more than 120 s"
    started = time.monotonic()
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, answer=failed, ack=True,
                            timeout=60)
    assert cancel and time.monotonic() - started < 30
    assert said[-1] == f"the trainer {failed} before it could checkpoint; cancelling (resume uses the last checkpoint)"


def test_a_trainer_that_answered_is_waited_for_past_the_answer_s_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop_module, "STOP_ANSWER_S", 1.0)
    started = time.monotonic()
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, ack=True, timeout=3)
    assert cancel and time.monotonic() - started >= 2.5
    assert said[-1] == "no checkpoint within 3 s; cancelling anyway (resume uses the last checkpoint)"


def test_a_trainer_that_finishes_its_last_step_is_left_to_end_its_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal came during the last step: the job writes its final model and ends COMPLETED, not CANCELLED."""
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, answer=STATUS_FINISHED,
                            job_ends_after=3)
    assert not cancel, said
    assert said[-1] == "the job ended by itself; the trial is complete"


def test_stop_after_the_last_step_waits_for_the_job_to_end_by_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cancel, said, scancels = _stop(tmp_path, monkeypatch, progress={**RUNNING, "status": STATUS_FINISHED},
                                   listed=False, job_ends_after=3)
    assert scancels == [] and not cancel, "no signal to a trainer that has ended, no cancel of its job"
    assert said == ["the trainer of exp/t has finished its last step; waiting for the job to end by itself",
                    "the job ended by itself; the trial is complete"]


def test_stop_between_restarts_cancels_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No trainer step to checkpoint (the supervisor restarts it): nobody can answer, so no wait for a timeout."""
    cancel, said, scancels = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=False)
    assert scancels == [] and cancel
    assert said == ["no trainer step is running now (between restarts?); cancelling at once (resume uses the last "
                    "checkpoint)"]


def test_stop_when_squeue_cannot_answer_cancels_without_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm.time, "sleep", lambda _: None)  # squeue's tries a second apart
    cancel, said, _ = _stop(tmp_path, monkeypatch, progress=RUNNING, listed=True, squeue_exit=1)
    assert cancel and "could not list the steps of job 1" in said[0] and "cancelling without a checkpoint" in said[0]


# ---- the job script's time-limit USR1 (the real supervisor template, run by bash) ------------------------------------


def run_time_limit(tmp_path: Path, *, packed: bool, squeue: str = 'printf "%s" "$LISTING"',
                   env_extra: dict[str, str] | None = None, usr1_wait: float = 5.0) -> tuple[list[str], str, float]:
    """The supervisor with two server steps that serve until stopped and a trainer step that waits for `done`; USR1
    is sent to it once all three run, then the trainer finishes (at once after USR1 reached it, else `usr1_wait` s
    after the signal) and the servers are stopped. `squeue` and `scancel` record their arguments; `squeue`'s answer
    is the `squeue` bash text. Returns the calls, the job log and the seconds from the signal to the trainer's USR1 (the
    whole wait when none came)."""
    (tmp_path / "logs").mkdir()
    serve = "while true; do sleep 0.1; done"
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=0, trainer_group=1, packed=packed, steps=[
        "STOP_GRACE=1",
        f"cmd_server_0() {{ {serve}; }}", f"cmd_server_1() {{ {serve}; }}",
        "cmd_grpo() { touch trainer-up; while [ ! -e done ]; do sleep 0.1; done; }",
        "component_policy 0 server 0 on-exit 0", "component_policy 1 trainer 1 on-failure 1",
        "start_step server-0 0 cmd_server_0", "start_step server-1 0 cmd_server_1", "start_step grpo 1 cmd_grpo",
    ], node_checks=["node_check_0() { return 0; }", "NODE_CHECKS=(node_check_0)"])
    bin_dir = slurm_bin(tmp_path, scancel='echo "scancel $*" >> calls.txt',
                        squeue=f'echo "squeue $*" >> calls.txt\n{squeue}')
    env = {"PATH": path_with(bin_dir), "SLURM_JOB_ID": "1", "LISTING": LISTING,
           **(env_extra or {})}
    if not packed:  # a heterogeneous job: Slurm gives the batch script each component's job id
        env.update(SLURM_JOB_ID_HET_GROUP_0="1", SLURM_JOB_ID_HET_GROUP_1="2")
    proc = subprocess.Popen(["bash", "-c", body], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "trainer-up").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "trainer-up").exists(), "the trainer step did not start"
        proc.send_signal(signal.SIGUSR1)
        signalled = time.monotonic()
        calls = tmp_path / "calls.txt"
        while "USR1" not in (calls.read_text() if calls.exists() else "") and time.monotonic() < signalled + usr1_wait:
            time.sleep(0.05)
        warned = time.monotonic() - signalled
        (tmp_path / "done").touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "rlkit: time limit near (USR1); asking the trainer to checkpoint and stop" in out
    return [line for line in (tmp_path / "calls.txt").read_text().splitlines() if "TERM" not in line], out, warned


def test_time_limit_usr1_reaches_a_packed_job_s_trainer_step_only(tmp_path: Path) -> None:
    calls, _, _ = run_time_limit(tmp_path, packed=True)
    assert [c for c in calls if c.startswith("scancel")] == ["scancel --ctld --signal=USR1 1.2"], calls
    assert "squeue --noheader --steps --jobs=1 --format=%i %j" in calls


def test_time_limit_usr1_reaches_a_heterogeneous_job_s_trainer_component(tmp_path: Path) -> None:
    calls, _, _ = run_time_limit(tmp_path, packed=False)
    assert calls == ["scancel --ctld --signal=USR1 2"], calls


def test_a_squeue_that_hangs_once_does_not_hold_the_warning_past_its_window(tmp_path: Path) -> None:
    """The controller hangs on the step listing (the first squeue never answers): the call ends after its bound
    (RLKIT_SLURM_CALL_TIMEOUT, 1 s here; 15 s of the 300 s warning in a job), the job log says so, the listing is
    asked again and the trainer's step gets its USR1 within two bounds, not never."""
    hang_once = f'[ -e {tmp_path}/hung ] || {{ touch {tmp_path}/hung; exec sleep 60; }}\nprintf "%s" "$LISTING"'
    calls, out, warned = run_time_limit(tmp_path, packed=True, squeue=hang_once,
                                        env_extra={"RLKIT_SLURM_CALL_TIMEOUT": "1"})
    assert "scancel --ctld --signal=USR1 1.2" in calls, out
    assert 1 <= warned < 4, warned
    assert "squeue --noheader --steps --jobs=1 --format=%i %j did not answer within 1 s" in out


def test_a_squeue_that_never_answers_gives_up_in_time_and_says_so(tmp_path: Path) -> None:
    """With no answer at all the trainer cannot be found (a packed job's servers must not get the signal): the
    script says so after two bounds and goes on supervising (the trainer finishes, the servers are stopped)."""
    calls, out, _ = run_time_limit(tmp_path, packed=True, squeue="exec sleep 60",
                                   env_extra={"RLKIT_SLURM_CALL_TIMEOUT": "1"}, usr1_wait=2.5)
    assert not [c for c in calls if c.startswith("scancel")], calls
    assert out.count("did not answer within 1 s (the Slurm controller is busy or unreachable)") == 2, out
    assert "no running trainer step to warn" in out and "rlkit: all work steps finished" in out


# ---- the no-retry code reaches the batch script (the real supervisor template, run by bash) ------------------------


def run_failing_trainer(tmp_path: Path, trainer: str, *, retries: int = 2, env_extra: dict[str, str] | None = None,
                        squeue: str = ":") -> tuple[int, str]:
    """The supervisor with one trainer step whose command is `trainer` (bash, in the trial directory; its output is
    the step's log as srun --output makes it) and `retries` restarts; returns the script's exit code and output."""
    (tmp_path / "logs").mkdir()
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=retries, trainer_group=0, packed=True, steps=[
        "STOP_GRACE=1", f"cmd_grpo() {{ {{ {trainer}; }} >> logs/grpo.log 2>&1; }}",
        "component_policy 0 trainer 1 on-failure 1", "start_step grpo 0 cmd_grpo",
    ], node_checks=["node_check_0() { return 0; }", "NODE_CHECKS=(node_check_0)"])
    bin_dir = slurm_bin(tmp_path, scancel=":", squeue=squeue)
    env = {"PATH": path_with(bin_dir), "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", **(env_extra or {})}
    run = subprocess.run(["bash", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    return run.returncode, run.stdout + run.stderr


def test_a_rank_s_no_retry_exit_is_honoured_when_srun_reports_another_rank_s_signal(tmp_path: Path) -> None:
    """Rank 0 exits 78 (a mistake a restart cannot fix) and srun kills rank 1, so srun reports 143: the step's log
    holds rank 0's mark for this very run, so the job fails with 78 at once, without a restart."""
    from rlkit.step_contract import NO_RETRY_EXIT, no_retry_mark

    mark = no_retry_mark({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1"})
    assert mark is not None
    rc, out = run_failing_trainer(tmp_path, f"echo 'rlkit train: a refused config'; echo '{mark}' >&2; exit 143")
    assert rc == NO_RETRY_EXIT, out
    assert "srun reports exit code 143, but one of its processes exited with 78" in out
    assert "not retrying" in out and "restarted step" not in out


def test_a_no_retry_mark_of_an_earlier_run_of_the_step_does_not_count(tmp_path: Path) -> None:
    """The log is appended to across runs: a mark of the job's first run (requeue 0) or of another restart does not
    make this run's plain failure a no-retry one; the step is restarted as usual."""
    from rlkit.step_contract import no_retry_mark

    old = [no_retry_mark({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "0"}),
           no_retry_mark({"SLURM_JOB_ID": "6", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1"}),
           no_retry_mark({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1",
                          "RLKIT_STEP_RETRY": "2"})]
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "grpo.log").write_text("".join(f"{line}\n" for line in old))
    (tmp_path / "logs").rename(tmp_path / "logs.keep")
    rc, out = run_failing_trainer(tmp_path, "cat logs.keep/grpo.log >> logs/grpo.log; exit 143", retries=1)
    assert rc == 143, out
    assert "restarted step grpo (retry 1 of 1" in out and "processes exited with 78" not in out
    assert "step grpo failed with exit code 143; stopping the other steps" in out  # out of restarts


def test_the_mark_is_printed_only_inside_a_slurm_step() -> None:
    from rlkit.step_contract import no_retry_mark

    assert no_retry_mark({"SLURM_JOB_ID": "7"}) is None  # the batch script or a login node: no step
    assert no_retry_mark({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) == "rlkit: no-retry exit of run 7.0.0"


def test_a_second_job_of_the_trial_exits_before_touching_it(tmp_path: Path) -> None:
    """Another job script holds the trial's job lock (flock on job.lock, naming it): this one waits
    RLKIT_TRIAL_LOCK_WAIT, then exits 78 naming the holder, and writes nothing: no step started, no job_end, the
    holder's name left as it was."""
    import fcntl

    from rlkit.step_contract import JOB_END, JOB_LOCK, NO_RETRY_EXIT

    lock = tmp_path / JOB_LOCK
    lock.write_text("job 6 on node1 since 2026-11-29T00:00:00Z\n")
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        rc, out = run_failing_trainer(tmp_path, "touch trainer-ran; exit 0", env_extra={"RLKIT_TRIAL_LOCK_WAIT": "1"},
                                      squeue="echo RUNNING")
    assert rc == NO_RETRY_EXIT, out
    assert "another job of this trial holds it (job 6 on node1 since" in out and "without touching the trial" in out
    assert not (tmp_path / "trainer-ran").exists() and not (tmp_path / JOB_END).exists()
    assert lock.read_text().startswith("job 6 on node1")


def test_the_job_lock_names_the_job_that_holds_it(tmp_path: Path) -> None:
    rc, out = run_failing_trainer(tmp_path, "cat job.lock > seen; exit 0")
    assert rc == 0, out
    assert (tmp_path / "seen").read_text().startswith("job 7 on ")


@pytest.mark.parametrize("holder, squeue", [
    ("7", "echo RUNNING"),  # this very job's earlier run (requeued after its node failed)
    ("6", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"),  # a job Slurm has forgotten
])
def test_a_lock_left_by_a_failed_node_does_not_stop_the_job(tmp_path: Path, holder: str, squeue: str) -> None:
    """flock on NFS: a dead node's client can leave the lock held; when it names this job or a job Slurm no longer
    knows, the job goes on (and says so) instead of failing a requeue that nothing else holds."""
    import fcntl

    from rlkit.step_contract import JOB_LOCK

    lock = tmp_path / JOB_LOCK
    lock.write_text(f"job {holder} on node1 since 2026-11-29T00:00:00Z\n")
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        rc, out = run_failing_trainer(tmp_path, "touch trainer-ran; exit 0", env_extra={"RLKIT_TRIAL_LOCK_WAIT": "1"},
                                      squeue=squeue)
    assert rc == 0, out
    assert f"still held for job {holder}, which is this job's earlier run or gone from Slurm; going on" in out
    assert (tmp_path / "trainer-ran").exists()

"""Fault injection on the real dev cluster, the job's and its servers' faults: a killed server restarted in the
allocation, the time limit's requeue, `rlkit stop` (answered by a trainer, and on a frozen one), two resumes at
once and a damaged checkpoint, a trial Slurm has forgotten. The trainer's own deaths and
silences: test_recovery_retries.py; steps that fail for good or lose their servers: test_recovery_steps_fail.py.
The killserver trial runs on ONE node (ONE_NODE: a packed placement, each step on its own slice of one node's GPUs):
a server restarts on its slice, and `rlkit stop` reaches the trainer's step by its step id. It trains on one rank:
nothing in it is between ranks (no periodic checkpoint, its trainer never dies). The timelimit trial is an sft job
(configs/sft-cpu-demo.yaml, one rank): its faults are the job's and the trainer's, the same for every job type, and
an sft trial starts no vLLM server (~25 CPU-s per run, and it runs three times). A job of one component is never
packed: the time-limit warning goes to the job's steps, its trainer's alone; the packed route (the trainer's step by
its id, the servers' spared) is not under test here.

How the recovery scenarios run and share trials: tests/helpers/recovery.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.recovery import (
    EXPERIMENT,
    ONE_NODE,
    assert_continuous_and_right_data,
    assert_continuous_and_right_sft_rows,
    recovery_starter,
    running_step_id,
    submit_trial,
    trial_home,
    trial_metrics,
)
from tests.helpers.scenarios import ScenarioPool
from tests.helpers.slurm_helpers import (
    processes_mentioning,
    signal_pending,
    status_row,
    trained_steps,
    trainer_rank_pid,
    wait_for,
    wait_state,
)

# a test waits for its own scenario, which may have queued behind others in the pool: a longer per-test limit
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(2700)]
# the timelimit trial (sft: 16 steps per epoch, ~0.2 CPU-s each): its trainer is held at step 8 or a little later for
# the time limit's warning, and held again STOP_AFTER steps into the requeued run for the stop (measured: requeued
# after step 9, stopped after step 12); 32 steps (two epochs) leave the requeued run room to be stopped before its end
TIMELIMIT_STEPS, STOP_AFTER = 32, 2
SFT_EXPERIMENT = "demo-sft"  # configs/sft-cpu-demo.yaml's experiment_name: the timelimit trial's
AFTER_REJOIN = 3  # the killserver trial's steps with both servers after the restarted one rejoined, then stopped


# ---- the scenarios: submit, inject the fault, wait for the end state (side by side: tests/helpers/scenarios.py) ----

def _first_step(trial: Path, after: int, servers: Callable[[int], bool]) -> int | None:
    """The first step after `after` whose weights reached a number of servers that `servers` accepts, once there is
    one."""
    steps = [m for m in trial_metrics(trial) if m["step"] > after and servers(m["weight_sync/servers_at_version"])]
    return int(steps[0]["step"]) if steps else None



class KillServerRun(NamedTuple):
    """What the killserver trial left for its three tests (one trainer rank, two servers)."""

    trial: Path
    killed_at: int  # the first step trained without server 1
    stopped_at: int  # the last step trained before the stop
    stop: subprocess.CompletedProcess[str]  # `rlkit stop` on the frozen trainer
    stop_seconds: float  # how long that stop took


def _kill_server(env: dict[str, object]) -> KillServerRun:
    """Server 1's step killed, restarted by the job, back at the current weights; then `rlkit stop` on a frozen
    trainer. By broadcast, with a tied model: the lost server's group is torn down and its replacement joins a new one
    before its first push; the fingerprint after every push proves the tied output head right each time. The run
    may train up to 500 steps (~1 s each with one server), room for a vLLM restart under any load here (60-90 s
    alone; in CI the restarted server rejoined at step 98), but is stopped AFTER_REJOIN steps after the restarted
    server got its first push: the steps past that prove nothing more and were a third of the trial's CPU. No
    periodic checkpoint (freq_steps and freq_secs off): the stop's test asserts that none was written, and a
    checkpoint every 100 steps fired at step 100 in CI."""
    trial = submit_trial(env, "killserver", "total_train_epochs=8", "total_train_steps=500",
                         "recover.freq_steps=null", "recover.freq_secs=null", "actor.weight_update_mode=xccl",
                         f"actor.path={env['tied']}", "allocation_mode=vllm:d2+fsdp:d1", *ONE_NODE)
    name, home = f"{EXPERIMENT}/killserver", trial_home(env, "killserver")
    wait_for(lambda: trained_steps(trial) >= 3, "3 trained steps", timeout=600, trial=trial)
    job_id = str(status_row(name, home)["job_id"])
    step = wait_for(lambda: running_step_id(job_id, "server-1"), "the server-1 step", trial=trial)
    asked_at = trained_steps(trial)
    subprocess.run(["scancel", "--signal=KILL", step], check=True)  # every process of the step dies at once
    # the step in flight may still reach both servers before the kill lands: the loss counts from the first without
    killed_at = int(wait_for(lambda: _first_step(trial, asked_at, lambda n: n < 2), "a step without server 1",
                             timeout=300, trial=trial))
    rejoin = int(wait_for(lambda: _first_step(trial, killed_at, lambda n: n == 2),
                          "server 1 back at the current weights", timeout=900, trial=trial))
    wait_for(lambda: trained_steps(trial) >= rejoin + AFTER_REJOIN, f"{AFTER_REJOIN} steps with both servers",
             timeout=300, trial=trial)
    stopped, seconds = _stop_a_frozen_trainer(trial, name, home)
    assert wait_state(name, timeout=120, env=home, trial=trial) == "CANCELLED"
    wait_for(lambda: not processes_mentioning(str(trial)), "every step to end", timeout=90)
    return KillServerRun(trial, killed_at, trained_steps(trial), stopped, seconds)


def _stop_a_frozen_trainer(trial: Path, name: str,
                           home: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """`rlkit stop` while trainer rank 0 is frozen (SIGSTOP stops every thread of it, the one that answers a stop
    too), as a rank stuck in a kernel or on a node in trouble would be; continued once the stop has returned (the job
    is being cancelled by then)."""
    pid = trainer_rank_pid(trial)
    assert pid is not None, "no trainer rank 0 to freeze"
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        stopped = run_rlkit("stop", name, env=home)
    finally:
        with contextlib.suppress(ProcessLookupError):  # most often already ended by the job's cancel
            os.kill(pid, signal.SIGCONT)
    return stopped, time.monotonic() - started



class TimeLimitRun(NamedTuple):
    """What the timelimit trial left for its three tests."""

    trial: Path
    info: str  # Slurm's record of the job (attempt 1), read before MinJobAge
    stop_step: int  # the step `rlkit stop` checkpointed (in the requeued run)
    previous: int  # the checkpoint the resume used, the newest one being damaged


def _time_limit_then_stop_and_resume(env: dict[str, object]) -> TimeLimitRun:
    """One sft trial (one rank, no server: its faults are the job's), two faults at different steps
    (recover.freq_steps=100: no periodic checkpoint):
    - the time limit: after 8 steps Slurm's USR1 to the batch script, the trainer held until the warning reaches it;
      the trainer checkpoints, the job requeues;
    - stop and resume: once the requeued run has trained STOP_AFTER steps of its own, `rlkit stop` (it checkpoints
      the last step), the newest checkpoint damaged, `rlkit resume`: the resume skips it and uses the previous one,
      the time limit's."""
    trial = submit_trial(env, "timelimit", f"total_train_steps={TIMELIMIT_STEPS}", "recover.freq_steps=100",
                         "allocation_mode=fsdp:d1", job="sft")
    name, home = f"{SFT_EXPERIMENT}/timelimit", trial_home(env, "timelimit")
    job_id = str(status_row(name, home)["job_id"])
    wait_for(lambda: trained_steps(trial) >= 8, "8 trained steps", timeout=600, every=0.2, trial=trial)
    _time_limit_while_held(trial, job_id)
    # the requeue hold (cred_expire + 1 s), then the requeued run resumes and trains STOP_AFTER steps of its own
    requeued_from = int(wait_for(lambda: re.search(r"resuming after step (\d+) ", (trial / "logs" / "sft.log")
                                                   .read_text()), "the requeued run's resume", timeout=900,
                                 trial=trial).group(1))
    wait_for(lambda: trained_steps(trial) >= requeued_from + STOP_AFTER, "steps of the requeued run", timeout=600,
             every=0.2, trial=trial)
    stopped = _stop_while_held(trial, name, home)
    assert stopped.returncode == 0, stopped.stderr
    assert "the trainer checkpointed" in stopped.stdout, stopped.stdout
    assert wait_state(name, timeout=120, env=home, trial=trial) == "CANCELLED"
    # read now: Slurm forgets a finished job after MinJobAge (300 s), and the test may run later than that
    info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    wait_for(lambda: not processes_mentioning(str(trial)), "every step to end", timeout=90)
    from rlkit.trainer.recover import checkpoints

    saved = checkpoints(trial / "recover")
    stop_step = trained_steps(trial)
    assert saved[0][0] == stop_step, "rlkit stop must checkpoint the last finished step"
    # damage the newest checkpoint: resume must skip it, warn, and use the previous one
    newest, previous = saved[0][1], saved[1][0]
    victim = max((p for p in newest.rglob("*") if p.is_file() and p.name != "MANIFEST.json"),
                 key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    _resume_twice_at_once(name, home)
    assert wait_state(name, timeout=900, env=home, trial=trial) == "COMPLETED"
    return TimeLimitRun(trial, info, stop_step, previous)


def _time_limit_while_held(trial: Path, job_id: str) -> None:
    """Slurm's time-limit warning (what --signal=B:USR1@T sends the batch script) while the trainer is held: an sft
    step takes a fraction of a second, and the trainer would otherwise train on (or finish) while the warning
    travels. It then checkpoints the step it was in, as a trainer that was never held would."""
    with _trainer_held(trial) as pid:
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
        wait_for(lambda: signal_pending(pid, signal.SIGUSR1), "the warning's USR1 to reach the held trainer",
                 timeout=300, every=0.2, trial=trial)


@contextlib.contextmanager
def _trainer_held(trial: Path) -> Iterator[int]:
    """Trainer rank 0 stopped (SIGSTOP) for the block, continued after it: a signal sent meanwhile stays pending until
    the block has seen it arrive. Yields its pid."""
    pid = trainer_rank_pid(trial)
    assert pid is not None, "no trainer rank 0 to hold"
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def _stop_while_held(trial: Path, name: str, home: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`rlkit stop` while the (one-rank) trainer is held by SIGSTOP, released once the stop's USR2 waits for it: on
    a busy machine the requeued run otherwise trained its last steps while the CLI started, and the stop found the
    trainer's step ended (the suite beside a busy core failed here). The trainer then checkpoints the step it was
    in, as a trainer that was never held would."""
    with _trainer_held(trial) as pid:
        stopping = subprocess.Popen([sys.executable, "-m", "rlkit", "stop", name], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env={**os.environ, **home})
        wait_for(lambda: signal_pending(pid, signal.SIGUSR2) or stopping.poll() is not None,
                 "the stop's USR2 to reach the held trainer", timeout=300, every=0.2, trial=trial)
    out, err = stopping.communicate(timeout=600)
    return subprocess.CompletedProcess(stopping.args, stopping.returncode, out, err)


def _resume_twice_at_once(name: str, home: dict[str, str]) -> None:
    """Two `rlkit resume` of the stopped trial started together: exactly one submits (attempt 2), the other is
    refused naming the winner's job (rlkit.trials.lock). Both once got through and two jobs trained on one trial
    directory, losing steps of metrics (issue 45); the test below then finds exactly one resume in the manifest."""
    argv = [sys.executable, "-m", "rlkit", "resume", name]
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **home}) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in both]
    results = [(proc.returncode, out, err) for proc, (out, err) in zip(both, outputs, strict=True)]
    won = [out for rc, out, _ in results if rc == 0]
    lost = [err for rc, _, err in results if rc != 0]
    assert len(won) == 1 and len(lost) == 1, results
    assert "(attempt 2)" in won[0], won
    job = re.search(r"as Slurm job (\d+)", won[0])
    assert job is not None, won
    assert f"job {job.group(1)}" in " ".join(lost[0].split()) and "Traceback" not in lost[0], lost



# longest first, so that the pool's last scenarios are short ones
SCENARIOS = {"killserver": _kill_server, "timelimit": _time_limit_then_stop_and_resume}
# the scenarios each test asserts on: running only some tests (-k) starts only their trials, and a new test must
# name the trial it rides on (start_background fails on a test not listed)
USES = {"test_killed_server_is_restarted_and_rejoins_with_the_current_weights": ("killserver",),
        "test_stop_on_a_frozen_trainer_cancels_after_its_answer_deadline": ("killserver",),
        "test_a_trial_slurm_has_forgotten_still_shows_how_it_ended": ("killserver",),
        "test_time_limit_warning_checkpoints_requeues_and_resumes": ("timelimit",),
        "test_stop_checkpoints_then_resume_continues_and_a_damaged_checkpoint_is_skipped": ("timelimit",),
        "test_resume_mode_with_nothing_to_resume_is_refused": ()}
start_background = recovery_starter(USES, SCENARIOS)


@pytest.fixture
def scenarios(background_scenarios: ScenarioPool) -> ScenarioPool:
    return background_scenarios


@pytest.fixture
def trial_env(background_scenarios: ScenarioPool) -> dict[str, object]:
    return background_scenarios.envs[__name__]  # type: ignore[no-any-return]


# ---- the tests: each waits for its scenario, then asserts on what it left ----

def test_killed_server_is_restarted_and_rejoins_with_the_current_weights(scenarios: ScenarioPool) -> None:
    trial, killed_at, stopped_at, _, _ = scenarios.result("killserver")
    batch_log = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert "server step server-1 exited" in batch_log and "restarted step server-1" in batch_log
    metrics = trial_metrics(trial)
    assert_continuous_and_right_data(trial, stopped_at)
    assert any(m["servers/unreachable"] == 1 for m in metrics), "the lost server must show in the metrics"
    # the trainer never stopped: no resume, and every step's weights reached every server it could reach
    trainer_log = (trial / "logs" / "grpo.log").read_text()
    assert "resuming after step" not in trainer_log
    assert "weights reach the servers by broadcast (xccl over gloo)" in trainer_log
    assert not (trial / "weights").exists() or not any((trial / "weights").iterdir()), "xccl wrote weights to disk"
    assert all(m["weight_sync/fingerprint_max_diff"] <= 1e-3 for m in metrics)
    back = [m for m in metrics if m["step"] > killed_at and m["weight_sync/servers_at_version"] == 2]
    assert len(back) >= AFTER_REJOIN, "server 1 never came back"
    # the restarted server got the current weights (and passed the fingerprint) before any request
    server_log = (trial / "logs" / "server-1.log").read_text()
    assert server_log.count("registered") >= 2, "server 1 did not register again"
    # the restarted process joined a group of its own after it registered (the first one joined before it died)
    restarted = server_log.rsplit("registered", 1)[1]
    assert "rlkit gloo weight transfer: joined" in restarted, "the restarted server never joined a weight group"
    rejoin = back[0]["step"]
    assert re.search(rf"servers \[0, 1\] at weight version {int(rejoin)},", trainer_log)
    # one shared node: the restart took the slice its first run left (the job's only free GPU), not another's
    slices = re.findall(r"^rlkit step slice: server-1 on (\S+) holds GPUs (\S+)$", server_log, re.MULTILINE)
    trainer_slice = re.findall(r"^rlkit step slice: grpo on (\S+) holds GPUs (\S+)$", trainer_log, re.MULTILINE)
    assert len(slices) >= 2 and len(set(slices)) == 1, slices
    assert trainer_slice and trainer_slice[0][0] == slices[0][0], (trainer_slice, slices)
    assert not set(slices[0][1].split(",")) & set(trainer_slice[0][1].split(",")), (trainer_slice, slices)
    assert "#SBATCH hetjob" not in (trial / "job.sbatch").read_text()
    assert processes_mentioning(str(trial)) == []
    # stopped: the job script's end record says CANCELLED (what rlkit status shows once Slurm forgets the job)
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import attempts, read_job_end

    end = read_job_end(TrialPaths(trial), str(attempts(TrialPaths(trial))[-1]["job_id"]))
    assert end is not None and end.state == "CANCELLED", (trial / "job_end").read_text()



def test_time_limit_warning_checkpoints_requeues_and_resumes(scenarios: ScenarioPool) -> None:
    """The requeue is the timelimit trial's first Slurm run (attempt 1, logs/attempt-1/ after the stop test's resume):
    the only redone steps of the trial are those the stop test's damaged checkpoint made the resume redo."""
    run = scenarios.result("timelimit")
    trial = run.trial
    assert "Restarts=1" in run.info
    script = (trial / "job.sbatch").read_text()
    assert "PACKED=0" in script and "#SBATCH hetjob" not in script, "one component: USR1 goes to the job's steps"
    batch_log = next((trial / "logs" / "attempt-1").glob("slurm-*.out")).read_text()
    assert "time limit near (USR1)" in batch_log and "requeueing the job (requeue 1 of 3)" in batch_log
    trainer_log = (trial / "logs" / "attempt-1" / "sft.log").read_text()
    assert "got SIGUSR1: checkpoint after this step" in trainer_log, "the warning never reached the trainer"
    saved = re.search(r"recover checkpoint of step (\d+)", trainer_log)
    assert saved, "no checkpoint on the warning (freq_steps=100 never triggers one)"
    assert f"resuming after step {saved.group(1)} " in trainer_log
    assert_continuous_and_right_sft_rows(trial, TIMELIMIT_STEPS)  # not a single step lost
    # not a single step redone by the requeue: the discarded metrics are exactly the steps after the warning's
    # checkpoint up to the stop, each once (the stop test's resume from it, its newer checkpoint damaged)
    from rlkit.trainer.stats_logger import read_metrics

    assert run.previous == int(saved.group(1))
    discarded = [int(m["step"]) for m in read_metrics(trial / "metrics.discarded.jsonl")]
    assert discarded == list(range(run.previous + 1, run.stop_step + 1)), discarded


def test_stop_checkpoints_then_resume_continues_and_a_damaged_checkpoint_is_skipped(
        scenarios: ScenarioPool) -> None:
    """The timelimit trial carries it: stopped in its requeued run, resumed as attempt 2. The steps the resume redid
    (after the previous checkpoint, up to the stop) trained from the same weights and optimizer state on the same
    rows as the discarded ones: the same loss, to the bit."""
    run = scenarios.result("timelimit")
    trial, previous = run.trial, run.previous
    trainer_log = (trial / "logs" / "sft.log").read_text()
    assert "is damaged" in trainer_log and f"resuming after step {previous} " in trainer_log
    assert (trial / "logs" / "attempt-1" / "sft.log").is_file(), "the first attempt's logs must be kept"
    manifest = json.loads((trial / "manifest.json").read_text())
    assert [a["kind"] for a in manifest["attempts"]] == ["submit", "resume"]
    metrics = assert_continuous_and_right_sft_rows(trial, TIMELIMIT_STEPS)
    from rlkit.trainer.stats_logger import read_metrics

    redone = {int(m["step"]): m["sft/loss"] for m in metrics if previous < m["step"] <= run.stop_step}
    discarded = {int(m["step"]): m["sft/loss"] for m in read_metrics(trial / "metrics.discarded.jsonl")}
    assert redone and redone == discarded, (redone, discarded)
    assert processes_mentioning(str(trial)) == []


def test_resume_mode_with_nothing_to_resume_is_refused(trial_env: dict[str, object]) -> None:
    result = run_rlkit("submit", str(CONFIGS / "grpo-cpu-demo.yaml"), *trial_env["base"],  # type: ignore[misc]
                       "trial_name=nothing", "recover.mode=resume", env=trial_home(trial_env, "nothing"))
    assert result.returncode == 2 and "nothing to resume" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (Path(str(trial_env["root"])) / EXPERIMENT / "nothing").exists()



def test_stop_on_a_frozen_trainer_cancels_after_its_answer_deadline(scenarios: ScenarioPool) -> None:
    """`rlkit stop` of the killserver trial while trainer rank 0 is frozen: the trainer cannot answer the signal, so the
    stop says so after STOP_ANSWER_S and cancels the job (CANCELLED) instead of waiting out its whole checkpoint
    timeout (300 s); nothing was checkpointed (the trial has no periodic checkpoint either)."""
    from rlkit.step_contract import STOP_ANSWER_S
    from rlkit.trainer.recover import checkpoints

    run = scenarios.result("killserver")
    said = " ".join(run.stop.stdout.split())
    assert run.stop.returncode == 0, run.stop.stdout + run.stop.stderr
    assert f"the trainer did not answer the signal within {STOP_ANSWER_S:.0f} s" in said, said
    assert "cancelling without a new checkpoint" in said and "the trainer checkpointed" not in said, said
    assert STOP_ANSWER_S <= run.stop_seconds < STOP_ANSWER_S + 60, run.stop_seconds
    assert not checkpoints(run.trial / "recover")
    assert status_row(f"{EXPERIMENT}/killserver", trial_home(scenarios.envs[__name__], "killserver"))["state"] == \
        "CANCELLED"


def test_a_trial_slurm_has_forgotten_still_shows_how_it_ended(scenarios: ScenarioPool,
                                                              trial_env: dict[str, object]) -> None:
    """Once the controller forgets a finished job (MinJobAge: 300 s on the dev cluster, which keeps no accounting,
    as many sites keep none for users), `rlkit status` shows the end the job script recorded, never UNKNOWN, and no
    step as running. The killserver trial, the first the session starts, ended (stopped: CANCELLED) long before this
    test, the file's last, runs; run alone, it waits for the controller to forget the job."""
    trial = scenarios.result("killserver").trial
    name, home = f"{EXPERIMENT}/killserver", trial_home(trial_env, "killserver")
    job_id = str(json.loads((trial / "manifest.json").read_text())["job_id"])

    def forgotten() -> bool:
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=False)
        return shown.returncode != 0 and "Invalid job id" in shown.stderr

    wait_for(forgotten, f"the controller to forget job {job_id} (MinJobAge)", timeout=900, every=10)
    assert status_row(name, home)["state"] == "CANCELLED"
    detail = run_rlkit("status", name, "--json", env=home)
    assert detail.returncode == 0, detail.stderr
    shown = json.loads(detail.stdout)
    assert shown["row"]["state"] == "CANCELLED" and "Slurm no longer knows the job" in detail.stdout, shown
    assert shown["trainer_status"] != "running" and not shown["servers"], shown
    assert all(component[1] != "RUNNING" for component in shown["components"]), shown

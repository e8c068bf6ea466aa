"""Fault injection on the real dev cluster, steps that fail: every server lost (the trainer checkpoints its last
step, the retry resumes it), a rollout that fails after its batch came, a trainer that can never make progress (a
crash loop, not retried again), a full disk (the no-retry exit, whatever code srun reports for the other rank), and
`submit --force` over a finished trial.

The crash loop and the full disk are the trainer's and the batch script's, the same for every job type (the fault
points are in rlkit/jobs/run.py and rlkit/trainer/loop_rank0.py): their trials are sft jobs
(configs/sft-cpu-demo.yaml), which start no inference server, so they cost no vLLM start (~25 CPU-s each) and no
server's node slice.

How the recovery scenarios run and share trials: tests/helpers/recovery.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.recovery import (
    EXPERIMENT,
    ONE_RANK,
    ONE_SERVER,
    assert_continuous_and_right_data,
    recovery_starter,
    running_step_id,
    submit_trial,
    trial_home,
    trial_metrics,
)
from tests.helpers.scenarios import ScenarioPool
from tests.helpers.slurm_helpers import (
    processes_mentioning,
    status_row,
    trained_steps,
    wait_for,
    wait_state,
)

# a test waits for its own scenario, which may have queued behind others in the pool: a longer per-test limit
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(2700)]


SFT_EXPERIMENT = "demo-sft"  # configs/sft-cpu-demo.yaml's experiment_name: the crashloop and diskfull trials'

# ---- the scenarios: submit, inject the fault, wait for the end state (side by side: tests/helpers/scenarios.py) ----

def _crash_loop(env: dict[str, object]) -> tuple[Path, str]:
    """An sft trial of one rank whose trainer dies at the start of every run (fault point die_at_start, as the step
    starts, before its job type's imports). Returns the trial and `rlkit status` once it failed."""
    trial = submit_trial(env, "crashloop", "total_train_steps=8", "allocation_mode=fsdp:d1",
                         "launcher.trainer_env_vars=OMP_NUM_THREADS=1,RLKIT_FAULT_INJECT=die_at_start", job="sft")
    name, home = f"{SFT_EXPERIMENT}/crashloop", trial_home(env, "crashloop")
    assert wait_state(name, timeout=600, env=home, trial=trial) == "FAILED"
    return trial, run_rlkit("status", name, env=home).stdout



ALLGONE_STEPS = 14  # the kill lands at step 6 or 7: the rest is the retry's, which must go on from its checkpoint


def _all_servers_gone(env: dict[str, object]) -> Path:
    trial = submit_trial(env, "allgone", f"total_train_steps={ALLGONE_STEPS}", "recover.freq_steps=1000", *ONE_RANK)
    name, home = f"{EXPERIMENT}/allgone", trial_home(env, "allgone")
    job_id = str(status_row(name, home)["job_id"])
    # the server steps are looked up before training starts, so that the kill follows step 6 at once
    steps = [wait_for(lambda: running_step_id(job_id, "server-0"), "the server-0 step", timeout=600, trial=trial)]
    wait_for(lambda: trained_steps(trial) >= 6, "6 trained steps", timeout=600, trial=trial)
    subprocess.run(["scancel", "--signal=KILL", *steps], check=True)
    assert wait_state(name, timeout=900, env=home, trial=trial) == "COMPLETED"
    return trial



def _rollout_fails_then_force(env: dict[str, object]) -> tuple[Path, str]:
    """The rollout-failure trial (it leaves a recover checkpoint of step 4 and saver checkpoints of every step), then
    `submit --force` over the finished trial: a new 1-step run. Returns the trial and the --force output."""
    trial = submit_trial(env, "rolloutfails", "total_train_steps=8", "recover.freq_steps=1000", "saver.freq_steps=1",
                    "launcher.trainer_env_vars=OMP_NUM_THREADS=1,RLKIT_FAULT_INJECT=rollout_fails@5", *ONE_SERVER)
    name, home = f"{EXPERIMENT}/rolloutfails", trial_home(env, "rolloutfails")
    assert wait_state(name, timeout=900, env=home, trial=trial) == "COMPLETED"
    forced = run_rlkit("submit", str(CONFIGS / "grpo-cpu-demo.yaml"), *env["base"],  # type: ignore[misc]
                       "trial_name=rolloutfails", "total_train_steps=1", *ONE_RANK, "--force", env=home)
    assert forced.returncode == 0, forced.stderr
    assert wait_state(name, timeout=900, env=home, trial=trial) == "COMPLETED"
    return trial, forced.stdout



DISK_FULL_AT = 2  # recover.freq_steps of the diskfull trial: its first checkpoint finds the disk full


def _disk_full(env: dict[str, object]) -> tuple[Path, str]:
    """An sft trial of two trainer ranks (no server): the disk fills up while rank 0 writes the step-2 checkpoint's
    state (fault point disk_full@2, an ENOSPC from the write) and rank 1 waits for it in a barrier. Rank 0 exits with
    the no-retry code; srun ends rank 1 (--kill-on-bad-exit) and reports the highest code of the two (143 when rank
    1's). Returns the trial and `rlkit status` once it failed."""
    trial = submit_trial(env, "diskfull", "total_train_steps=4", f"recover.freq_steps={DISK_FULL_AT}",
                         f"launcher.trainer_env_vars=OMP_NUM_THREADS=1,RLKIT_FAULT_INJECT=disk_full@{DISK_FULL_AT}",
                         job="sft")
    name, home = f"{SFT_EXPERIMENT}/diskfull", trial_home(env, "diskfull")
    assert wait_state(name, timeout=600, env=home, trial=trial) == "FAILED"
    return trial, run_rlkit("status", name, env=home).stdout


SCENARIOS = {"rolloutfails": _rollout_fails_then_force, "allgone": _all_servers_gone, "diskfull": _disk_full,
             "crashloop": _crash_loop}
USES = {"test_a_crash_loop_stops_early_with_its_own_reason": ("crashloop",),
        "test_all_servers_gone_checkpoints_then_the_retry_resumes_without_losing_a_step": ("allgone",),
        "test_a_failed_rollout_checkpoints_the_last_step_and_the_retry_loses_nothing": ("rolloutfails",),
        "test_force_over_a_trained_trial_is_a_new_run_from_the_base_model_and_keeps_the_old_one": ("rolloutfails",),
        "test_a_full_disk_fails_the_job_at_once_whatever_the_other_rank_exits_with": ("diskfull",)}
start_background = recovery_starter(USES, SCENARIOS)


@pytest.fixture
def scenarios(background_scenarios: ScenarioPool) -> ScenarioPool:
    return background_scenarios


# ---- the tests: each waits for its scenario, then asserts on what it left ----

def test_a_crash_loop_stops_early_with_its_own_reason(scenarios: ScenarioPool) -> None:
    """A trainer that fails before finishing any step is retried once, not recover.retries (3) times."""
    trial, detail = scenarios.result("crashloop")
    batch_log = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert batch_log.count("restarted step sft") == 1
    assert "again without finishing a step since its last restart (crash loop); not retrying" in batch_log
    assert "step sft failed" in detail and "die_at_start" in detail, detail
    assert processes_mentioning(str(trial)) == []



def test_all_servers_gone_checkpoints_then_the_retry_resumes_without_losing_a_step(
        scenarios: ScenarioPool) -> None:
    """Every server step dies (the trial runs one): the trainer checkpoints its last step and fails with that reason;
    the job restarts the servers and the trainer, which waits for healthy servers and resumes from that very step."""
    trial = scenarios.result("allgone")
    trainer_log = (trial / "logs" / "grpo.log").read_text()
    gone = re.search(r"checkpointed step (\d+), the trainer's retry resumes from it", trainer_log)
    assert gone, "the trainer must say why it stopped and what it saved"
    before, _, after = trainer_log.partition(f"resuming after step {gone.group(1)} ")
    assert after, "the retried trainer must resume from the checkpoint written when the servers were lost"
    last_finished = max(int(m) for m in re.findall(r"rlkit train: step (\d+)/", before))
    assert int(gone.group(1)) >= last_finished - 1, "at most the step in flight may be redone"
    assert_continuous_and_right_data(trial, ALLGONE_STEPS)
    assert processes_mentioning(str(trial)) == []



def test_a_failed_rollout_checkpoints_the_last_step_and_the_retry_loses_nothing(scenarios: ScenarioPool) -> None:
    """Rank 0 fails after a batch came back (fault point inside next_batch, before the batch is used): every rank
    checkpoints the last finished step before failing, and the positions of the unused batch are not recorded as
    consumed, so the retry redoes exactly that step with exactly that data (no periodic checkpoint is due)."""
    trial, _ = scenarios.result("rolloutfails")
    first_run = trial / "attempt-1"  # moved aside by the --force of the scenario's end
    trainer_log = (first_run / "logs" / "grpo.log").read_text()
    assert ("trainer rank 0 failed: StepError: fault injected: rollout_fails@5; checkpointed step 4, the trainer's "
            "retry resumes from it") in trainer_log
    assert "resuming after step 4 " in trainer_log
    assert_continuous_and_right_data(first_run, 8)
    assert processes_mentioning(str(trial)) == []


def test_force_over_a_trained_trial_is_a_new_run_from_the_base_model_and_keeps_the_old_one(
        scenarios: ScenarioPool) -> None:
    """`submit --force` over the finished rolloutfails trial, whose recover/ holds a valid step-4 checkpoint (in
    recover.mode=auto it would have been resumed before): the old run's files move to attempt-1/, and the new run
    trains step 1 from actor.path, so its weights are those of the old run's step 1 (same seed, same data), not of
    anything the old run trained later."""
    from safetensors.torch import load_file

    from rlkit.trainer.recover import latest_valid

    trial, output = scenarios.result("rolloutfails")
    old = trial / "attempt-1"
    assert f"moved to {old}" in output, output
    assert latest_valid(old / "recover", warn=False) is not None, "the old run's recover checkpoint is kept"
    assert {"final", "step1", "step8"} <= {p.name for p in (old / "checkpoints").iterdir()}
    assert (old / "config.yaml").is_file() and (old / "manifest.json").is_file()
    assert "resuming after step" not in (trial / "logs" / "grpo.log").read_text()
    assert [int(m["step"]) for m in trial_metrics(trial)] == [1]
    assert not (trial / "recover").exists() or latest_valid(trial / "recover", warn=False) is None
    new = load_file(str(trial / "checkpoints" / "final" / "model.safetensors"))
    old_step1 = load_file(str(old / "checkpoints" / "step1" / "model.safetensors"))
    old_final = load_file(str(old / "checkpoints" / "final" / "model.safetensors"))
    assert max(float((new[k] - old_step1[k]).abs().max()) for k in new) < 1e-4
    assert max(float((new[k] - old_final[k]).abs().max()) for k in new) > 1e-3




def test_a_full_disk_fails_the_job_at_once_whatever_the_other_rank_exits_with(scenarios: ScenarioPool) -> None:
    """A full disk is no transient fault: the step is not restarted (a retry would fill it again), the job fails at
    once naming the full disk, and `rlkit status` shows it. Rank 0's no-retry exit reaches the batch script through
    the mark in the step's log even when srun reports rank 1's code (issue 45 saw 143 and a restart in vain)."""
    from rlkit.step_contract import NO_RETRY_EXIT, NO_RETRY_MARK

    trial, status = scenarios.result("diskfull")
    batch_log = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert "restarting it" not in batch_log and "restarted step sft" not in batch_log, batch_log
    assert f"step sft failed with exit code {NO_RETRY_EXIT}, which a restart cannot fix" in batch_log, batch_log
    assert "rlkit: step sft: the disk is full (No space left on device)" in batch_log, batch_log
    reported = re.search(r"srun reports exit code (\d+), but one of its processes exited with", batch_log)
    print(f"srun reported {reported.group(1) if reported else NO_RETRY_EXIT} for the step")  # (-s) which case ran
    trainer_log = (trial / "logs" / "sft.log").read_text()
    assert re.search(rf"{re.escape(NO_RETRY_MARK)} \d+\.0\.0$", trainer_log, re.MULTILINE), trainer_log[-2000:]
    assert [int(s) for s in re.findall(r"rlkit train: step (\d+)/", trainer_log)] == list(range(1, DISK_FULL_AT + 1))
    assert "the disk is full" in " ".join(status.split()), status
    assert processes_mentioning(str(trial)) == []

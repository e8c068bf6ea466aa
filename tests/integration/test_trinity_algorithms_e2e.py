"""Trinity-RFT's algorithms and schedules end to end on the dev cluster (issue 49), two trials of the CPU demos in
the session's background (one server each):

- "mix": configs/grpo-mix-cpu-demo.yaml, GRPO carrying three things at once: the SFT+RL mix (8 expert rows per step,
  mix.mu 0.1), a weight push every 4 steps (actor.weight_update_interval; versions and the staleness bound count
  pushes) and a two-function weighted reward (reward.fns: digits 0.8, brevity 0.2);
- "opmd": configs/opmd-cpu-demo.yaml, job type opmd (group-baseline advantages, loss -A log pi / (1 + tau)).

Both must learn the digits task; the mix trial must push after steps 4, 8, 12 and 16 only, each push read back
and fingerprint-checked, and log each reward function beside their weighted sum.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import assert_every_version_fingerprinted, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(2700)]
STEPS = 16
INTERVAL = 4


def _trial(name: str, config: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
           *overrides: str) -> dict[str, Any]:
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    root = tmp_path_factory.mktemp(name)
    shutil.copytree(tiny_model_dir, root / "tiny-model")
    write_dataset(root / "digits.jsonl")
    write_sft_dataset(root)
    env = {"RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root), "RLKIT_DEMO_TRIAL": f"e2e_{name}",
           "RLKIT_DEMO_STEPS": str(STEPS), "RLKIT_FILEROOT": str(root / "fileroot")}
    began = time.monotonic()
    submitted = run_rlkit("submit", str(CONFIGS / config), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    trial = next((root / "fileroot").glob(f"*/e2e_{name}"))
    experiment = trial.parent.name
    state = wait_state(f"{experiment}/e2e_{name}", timeout=900, env=env)
    step = "opmd" if name == "opmd" else "grpo"
    logs = run_rlkit("logs", f"{experiment}/e2e_{name}", "--step", step, "--lines", "600", env=env)
    metrics = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()] \
        if (trial / "metrics.jsonl").exists() else []
    print(f"{name} trial: {STEPS} steps, submit to {state} in {time.monotonic() - began:.0f} s")
    return {"state": state, "trial": trial, "log": logs.stdout, "metrics": metrics}


# Servers and ranks only where they are under test (a vLLM start costs ~40 CPU-s of the suite's two cores, a rank's
# ~15): one server each (a push every 4 steps reaches one as it would two), two ranks for the mix (its RL and SFT
# losses are each averaged over every rank's tokens), one for OPMD (its loss is per token, nothing between ranks)
def _mix_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _trial("mix", "grpo-mix-cpu-demo.yaml", tiny_model_dir, tmp_path_factory, "allocation_mode=vllm:d1+fsdp:d2")


def _opmd_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _trial("opmd", "opmd-cpu-demo.yaml", tiny_model_dir, tmp_path_factory, "allocation_mode=vllm:d1+fsdp:d1")


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"mix": _mix_trial, "opmd": _opmd_trial}
USES = {"test_the_mix_trial_learns_with_its_expert_rows": ("mix",),
        "test_a_push_every_four_steps_counts_versions_in_pushes": ("mix",),
        "test_the_reward_mix_logs_each_function_and_their_weighted_sum": ("mix",),
        "test_opmd_learns_the_digits_task": ("opmd",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def mix_run(background_scenarios: ScenarioPool) -> dict[str, Any]:
    return background_scenarios.result("mix")  # type: ignore[no-any-return]


@pytest.fixture
def opmd_run(background_scenarios: ScenarioPool) -> dict[str, Any]:
    return background_scenarios.result("opmd")  # type: ignore[no-any-return]


def _learned(metrics: list[dict[str, Any]]) -> tuple[float, float]:
    first = sum(m["reward/mean"] for m in metrics[:3]) / 3
    last = sum(m["reward/mean"] for m in metrics[-3:]) / 3
    return first, last


def test_the_mix_trial_learns_with_its_expert_rows(mix_run: dict[str, Any]) -> None:
    assert mix_run["state"] == "COMPLETED", str(mix_run["log"])[-4000:]
    metrics = mix_run["metrics"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    first, last = _learned(metrics)
    assert last > first + 0.2, (first, last)
    assert "SFT+RL mix: " in str(mix_run["log"])
    for m in metrics:
        assert m["mix/mu"] == pytest.approx(0.1) and m["mix/expert_tokens"] > 0
    # the expert rows' loss falls: the model learns their answers' format (a space, digits, EOS)
    assert metrics[-1]["mix/sft_loss"] < metrics[0]["mix/sft_loss"]


def test_a_push_every_four_steps_counts_versions_in_pushes(mix_run: dict[str, Any]) -> None:
    metrics = mix_run["metrics"]
    pushed = [m["step"] for m in metrics if m["weight_sync/pushed"]]
    assert pushed == list(range(INTERVAL, STEPS + 1, INTERVAL))
    for m in metrics:
        version = m["step"] // INTERVAL
        assert m["weight_sync/version"] == version and m["weight_sync/server_version_min"] == version, m
        assert m["weight_sync/servers_at_version"] == 1
        assert m["staleness/max"] <= 0  # max_head_offpolicyness 0, counted in versions
    assert_every_version_fingerprinted(str(mix_run["log"]), [0], STEPS // INTERVAL)
    assert f"at weight version {STEPS // INTERVAL + 1}," not in str(mix_run["log"])


def test_the_reward_mix_logs_each_function_and_their_weighted_sum(mix_run: dict[str, Any]) -> None:
    for m in mix_run["metrics"]:
        digits, brevity = m["reward/fn/digits_reward/mean"], m["reward/fn/brevity_reward/mean"]
        assert m["reward/mean"] == pytest.approx(0.8 * digits + 0.2 * brevity, abs=1e-6)
        assert m["reward/fn/digits_reward/timeouts"] == 0 and m["reward/fn/brevity_reward/errors"] == 0


def test_opmd_learns_the_digits_task(opmd_run: dict[str, Any]) -> None:
    assert opmd_run["state"] == "COMPLETED", str(opmd_run["log"])[-4000:]
    metrics = opmd_run["metrics"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    first, last = _learned(metrics)
    assert last > first + 0.2, (first, last)
    assert all("opmd/advantage_abs_mean" in m for m in metrics)
    assert_every_version_fingerprinted(str(opmd_run["log"]), [0], STEPS)

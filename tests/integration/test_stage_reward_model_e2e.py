"""A reward model handed over between stages, end to end on the real dev Slurm cluster: the rm stage of
configs/sft-rw-ppo-cpu.yaml, then a grpo stage (the ppo stage as grpo: no critic to train, the cheapest RL
stage) naming no reward_model_path, as ONE `rlkit submit`. A run of its own rather than a third stage of
test_stages_e2e.py: an rw stage there would add its job and the reward model's scoring to a run that is already the
longest of the suite, and change the reward that run's assertions measure. Smallest steps: rw 2 steps on one rank,
grpo 2 steps on one rank, one server and one reward-model server.

The grpo stage serves the reward model on a server of its own (`reward.reward_model_engine_num: 1`: vLLM's pooling
runner, step aux-reward_model-0, a third component), as a GPU run would, rather than scoring on trainer rank 0's CPU
(that path: tests/integration/test_pairs_e2e.py; the two agree: tests/integration/test_reward_model_servers.py).

Why the assertions cannot pass by chance: the grpo stage scores with `reward.fns: {reward_model: 1.0}`, so each
step logs reward/fn/reward_model/{mean,errors}; a reward model that was not served (no directory, a wrong one, a
server that never started) fails every call, each counted in errors and scored exactly 0.0. Zero errors on every step
and a non-zero mean are only possible if the stage's reward-model server loaded the rm stage's checkpoints/final, the
path its config.yaml names; its access log must show a scoring request for at least every trained completion.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.slurm_helpers import wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1500)]
EXPERIMENT, RUN, STEPS = "demo-rlhf", "rme2e", 2
BATCH = 4 * 8  # the ppo stage of configs/sft-rw-ppo-cpu.yaml: prompts per step x samples per prompt


@pytest.fixture(scope="module")
def rm_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_pairs import write_pair_splits

    root = tmp_path_factory.mktemp("rm-stages-e2e")
    shutil.copytree(tiny_model_dir, root / "tiny-model")
    write_pair_splits(root)
    write_dataset(root / "digits.jsonl")
    data = yaml.safe_load((CONFIGS / "sft-rw-ppo-cpu.yaml").read_text())
    _, rm, rl = data["stages"]
    rl = {**rl, "stage_name": "grpo", "type": "grpo",
          "reward": {"fns": {"reward_model": 1.0}, "num_workers": 2, "reward_model_engine_num": 1}}
    rl.pop("critic")
    data["stages"] = [rm, rl]
    config = root / "rm-grpo.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {"RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root)}
    submitted = run_rlkit("submit", str(config), f"cluster.fileroot={root}/fileroot", f"trial_name={RUN}",
                          "stats_logger.tensorboard.path=null", f"total_train_steps={STEPS}",
                          "stages.rm.allocation_mode=fsdp:d1", "stages.rm.cluster.n_nodes=1",
                          "stages.grpo.allocation_mode=vllm:d1+fsdp:d1", "stages.grpo.cluster.n_nodes=3", env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    trials = root / "fileroot" / EXPERIMENT
    states = {stage: wait_state(f"{EXPERIMENT}/{RUN}_{stage}", timeout=900, env=env) for stage in ("rm", "grpo")}
    return {"states": states, "rm": trials / f"{RUN}_rm", "grpo": trials / f"{RUN}_grpo",
            "log": run_rlkit("logs", f"{EXPERIMENT}/{RUN}_grpo", "--step", "grpo", "--lines", "300",
                             env=env).stdout,
            "reward_server_log": run_rlkit("logs", f"{EXPERIMENT}/{RUN}_grpo", "--step", "aux-reward_model-0",
                                           "--lines", "5000", env=env).stdout,
            "run_json": run_rlkit("status", f"{EXPERIMENT}/{RUN}", "--json", env=env)}


def test_the_grpo_stage_scores_with_the_rm_stages_final_model(rm_run: dict[str, object]) -> None:
    from rlkit.config.load import load_config
    from rlkit.config.model_config import VALUE_HEAD_NOTE
    from rlkit.trainer.stats_logger import read_metrics

    assert rm_run["states"] == {"rm": "COMPLETED", "grpo": "COMPLETED"}, str(rm_run["log"])[-4000:]
    rm, grpo = Path(str(rm_run["rm"])), Path(str(rm_run["grpo"]))
    final = rm / "checkpoints" / "final"
    assert json.loads((final / VALUE_HEAD_NOTE).read_text())["kind"] == "reward"
    assert load_config(grpo / "config.yaml").reward.reward_model_path == str(final)
    metrics = read_metrics(grpo / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["reward/fn/reward_model/errors"] == 0 for m in metrics), metrics
    assert all(m["reward/fn/reward_model/mean"] != 0.0 for m in metrics), metrics
    served = str(rm_run["reward_server_log"])
    assert "--runner pooling" in served or "'runner': 'pooling'" in served, served[-3000:]
    trained = STEPS * BATCH  # completions trained on; rollouts running ahead are scored too
    assert len(re.findall(r'"POST /pooling HTTP/1\.1" 200', served)) >= trained, served[-3000:]
    assert "auxiliary models reward_model at" in str(rm_run["log"])
    detail = json.loads(rm_run["run_json"].stdout)  # type: ignore[attr-defined]
    assert [(s["stage"], s["state"], s["final"]) for s in detail["stages"]] == [
        ("rm", "COMPLETED", True), ("grpo", "COMPLETED", True)]

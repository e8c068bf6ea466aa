"""`rlkit migrate` of a verl run scored by a reward model (reward_model.enable, rlkit.config.verl.reward_model): it was
refused outright; now it becomes reward.fn reward_model on servers of the model's own, their GPUs taken from the run's
(verl colocates them with the actor) or on nodes added for verl's pool of its own, and what rlkit's reward would
not be verl's is refused with the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.config.verl.source import read_script
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.unit.config.test_verl_learning import _script
from tests.unit.config.test_verl_migrate import _migrated, _said

# verl's examples/ppo_trainer/run_qwen2-7b_rm.sh's reward model, on verl's reward loop (colocated)
LOOP = ("reward_model.enable=True", "reward_model.model.path=$HOME/models/FsfairX-LLaMA3-RM-v0.1",
        "reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm",
        "reward_model.rollout.gpu_memory_utilization=0.8", "reward_model.rollout.tensor_model_parallel_size=1",
        "reward_model.rollout.prompt_length=2048", "reward_model.rollout.response_length=1024",
        "reward_model.num_workers=8")
TP = "reward_model.rollout.tensor_model_parallel_size"
# run_qwen2.5-3b_rm_legacy.sh's: verl's legacy FSDP worker
LEGACY = ("reward_model.enable=True", "reward_model.model.path=$HOME/models/Skywork-Reward-V2-Llama-3.2-3B",
          "reward_model.use_reward_loop=False", "reward_model.model.use_remove_padding=True",
          "reward_model.model.fsdp_config.param_offload=True", "reward_model.micro_batch_size_per_gpu=32")


@pytest.fixture(scope="module")
def rm_site(site: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The site with a reward model trained elsewhere: the tiny model as a one-label sequence classifier."""
    model = Path(next(word.split("=", 1)[1] for word in site if word.startswith("actor.path=")))
    rm = tmp_path_factory.mktemp("verl-rm") / "rm"
    shutil.copytree(model, rm)
    config = json.loads((rm / "config.json").read_text())
    (rm / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForSequenceClassification"],
                                                "num_labels": 1}))
    return [*site, f"reward.reward_model_path={rm}"]


def _rendered(tmp_path: Path, overrides: list[str], *lines: str) -> tuple[Any, dict[str, str], list[str]]:
    """(the config, the header's fates, the plan's steps as name:gpus) of the GRPO script with `lines` added."""
    script = tmp_path / "run.sh"
    script.write_text(_script(*lines))
    text = _migrated(script, overrides)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    prepared = prepare(clean, [], dry_run=True)
    return prepared.config, _said(text), [f"{s.name}:{s.gpus_per_node}" for s in prepared.plan.steps]


def _mapping(*lines: str, overridden: Any = ()) -> tuple[dict[str, Any], dict[str, str]]:
    mapping, fates = verl_to_rlkit(read_script(_script(*lines), "t").leaves, "t", REGISTRY.verl_estimators,
                                   overridden)
    return mapping, {f.key: f.fate for f in fates}


def test_a_reward_loop_run_is_scored_by_the_model_on_servers_taken_from_its_gpus(
        tmp_path: Path, rm_site: list[str]) -> None:
    config, said, steps = _rendered(tmp_path, rm_site, *LOOP)
    reward = config.reward
    assert (reward.fn, reward.reward_model_engine_num, reward.reward_model_tensor_parallel_size) == \
           ("reward_model", 1, 1)
    assert reward.reward_model_max_model_len is None  # verl's servers take the model's own context
    # 8 GPUs: the reward model's server takes 1, the other 7 split as before (one rollout server of 2, trainer 5)
    assert config.allocation_mode == "vllm:d1t2+fsdp:d5" and config.cluster.n_nodes == 1
    assert steps == ["server-0:2", "aux-reward_model-0:1", "grpo:5"]
    assert "the reward model's server(s) on the other 1" in said["actor_rollout_ref.rollout.tensor_model_parallel_size"]
    assert said["reward_model.rollout.tensor_model_parallel_size"].startswith(
        "converted to reward.reward_model_engine_num 1 server(s) of reward.reward_model_tensor_parallel_size 1")
    assert "generation limit" in said["reward_model.rollout.prompt_length"]
    assert said["reward_model.num_workers"].startswith("left out (verl's processes")
    assert said["reward_model.model.path"] == "left out (your reward.reward_model_path override is used)"


def test_the_model_s_path_and_context_move_and_the_default_scorer_is_not_written() -> None:
    mapping, said = _mapping(*LOOP, "reward_model.rollout.max_model_len=4096")
    reward = mapping["reward"]
    assert reward["fn"] == "reward_model" and reward["reward_model_path"] == "$HOME/models/FsfairX-LLaMA3-RM-v0.1"
    assert reward["reward_model_max_model_len"] == 4096
    assert said["reward_model.rollout.max_model_len"] == "moved to reward.reward_model_max_model_len"


def test_a_pool_of_its_own_becomes_servers_on_nodes_added_to_the_run(tmp_path: Path, rm_site: list[str]) -> None:
    config, said, steps = _rendered(tmp_path, rm_site, *LOOP, "reward_model.enable_resource_pool=True",
                                    "reward_model.nnodes=1", "reward_model.n_gpus_per_node=4",
                                    "reward_model.rollout.tensor_model_parallel_size=2")
    assert (config.reward.reward_model_engine_num, config.reward.reward_model_tensor_parallel_size) == (2, 2)
    assert (config.allocation_mode, config.cluster.n_nodes) == ("vllm:d2t2+fsdp:d4", 2)  # the 8 split as verl's
    assert steps == ["server-0:2", "server-1:2", "aux-reward_model-0:2", "aux-reward_model-1:2", "grpo:4"]
    assert said["trainer.nnodes"] == "moved to cluster.n_nodes plus 1 node(s) for the reward model's pool"


def test_a_legacy_worker_s_model_is_served_whole_on_one_gpu_and_its_execution_keys_left_out() -> None:
    mapping, said = _mapping(*LEGACY)
    assert (mapping["reward"]["reward_model_engine_num"], mapping["reward"]["reward_model_tensor_parallel_size"]) \
        == (1, 1)
    assert "shards the model over its GPUs with FSDP" in said["reward_model.enable_resource_pool"]
    assert said["reward_model.micro_batch_size_per_gpu"].startswith("left out (how verl runs the model's forward")
    assert mapping["allocation_mode"] == "vllm:d1t2+fsdp:d5"


def test_gpus_too_few_for_the_reward_model_s_servers_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        _mapping(*LOOP, "reward_model.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=6")
    said = str(info.value)
    assert "leaves the trainer none of the run's 6 after the reward model's server(s) took 4" in said
    assert "reward_model.enable_resource_pool=True" in said
    mapping, _ = _mapping(*LOOP, "reward_model.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=6",
                          overridden={"allocation_mode": "vllm:d1+fsdp:d1"})
    assert mapping["reward"]["reward_model_engine_num"] == 1
    mapping, said = _mapping(*LOOP, "reward_model.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=6",
                             overridden={"reward.reward_model_tensor_parallel_size": "1"})
    assert mapping["allocation_mode"] == "vllm:d1t2+fsdp:d3"  # the 6 less the 1 GPU of the server asked for
    assert said[TP].endswith("your reward.reward_model_tensor_parallel_size 1 override(s) win: 1 GPU(s) taken")


@pytest.mark.parametrize("lines, says", [
    (("custom_reward_function.path=/r.py",), "verl's reward loop then scores with that function alone"),
    (("custom_reward_function.path=/r.py", "reward_model.use_reward_loop=False"), "replaces that function's"),
    (("reward_model.enable_resource_pool=True",), "not room for a server of 1 GPU(s)"),
    (("reward_model.use_reward_loop=False", "reward_model.megatron.use_dist_checkpointing=True"),
     "Megatron distributed checkpoint"),
    (("reward_model.model.external_lib=my_rm",), "register the reward model's architecture"),
    (("reward_model.model.trust_remote_code=True",), "runs code of its own"),
    (("reward_model.use_reward_loop=False", "reward_model.model.override_config.num_labels=2"),
     "overrides the reward model's config.json"),
])
def test_a_reward_rlkit_would_not_score_as_verl_is_refused(lines: tuple[str, ...], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _mapping(*LOOP, *lines)
    assert says in str(info.value)


def test_the_user_s_reward_override_decides_whether_the_model_scores() -> None:
    custom = (*LOOP, "custom_reward_function.path=/r.py")
    mixed, said = _mapping(*custom, overridden={"reward.fns": "{reward_model: 1.0, /r.py:fn: 0.5}",
                                                "reward.fn": "/r.py:fn"})
    assert mixed["reward"]["reward_model_engine_num"] == 1 and "fn" not in mixed["reward"]
    assert said["reward_model.enable"].endswith("your reward.fn / reward.fns override names it")
    alone, said = _mapping(*LOOP, overridden={"reward.fn": "math"})
    assert "reward_model_engine_num" not in alone["reward"] and "reward_model_path" not in alone["reward"]
    assert said["reward_model.rollout.tensor_model_parallel_size"].startswith("left out (your reward.fn")
    assert alone["allocation_mode"] == "vllm:d2t2+fsdp:d4"  # no GPUs taken for a model that does not score

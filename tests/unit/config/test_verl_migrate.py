"""`rlkit migrate` reads verl runs: a run script of verl.trainer.main_ppo (modelled on verl's
examples/grpo_trainer and ppo_trainer scripts, written here) or a verl YAML config becomes an rlkit config that loads
and renders, every verl key named in the header with what became of it, and what rlkit cannot take exits 2 naming each
problem and its fix."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkit.config.areal.migrate import migrate
from rlkit.config.load import config_from_mapping
from rlkit.config.schema.actor import KLControlConfig
from rlkit.config.verl.keys import VERL_KEYS
from rlkit.config.verl.layout import split
from rlkit.config.verl.migrate import as_rlkit_file
from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.config.verl.source import read_script
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit
from tests.helpers.verl_rows import ANSWER

VAL = "actor_rollout_ref.rollout.val_kwargs"

GRPO_SCRIPT = r"""#!/usr/bin/env bash
# GRPO on GSM8K, one node of 8 GPUs
set -x
export VLLM_ATTENTION_BACKEND=XFORMERS
MODEL=Qwen/Qwen2.5-3B-Instruct

PYTHONUNBUFFERED=1 /opt/conda/bin/python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$HOME/data/gsm8k/train.parquet" \
    data.val_files=${HOME}/data/gsm8k/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_grpo_gsm8k' \
    trainer.experiment_name="qwen2.5_3b-grpo" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    +trainer.val_before_train=False \
    ++actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.made_up_knob=3 \
    trainer.total_epochs=15 "$@" 2>&1 | tee verl_grpo.log   # keep a log
"""

PPO_SCRIPT = r"""set -x
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    critic.optim.lr=1e-5 \
    critic.model.path=deepseek-ai/deepseek-llm-7b-chat \
    critic.model.enable_gradient_checkpointing=True \
    critic.ppo_micro_batch_size_per_gpu=32 \
    critic.cliprange_value=0.5 \
    trainer.project_name=verl_example_gsm8k \
    trainer.experiment_name=deepseek_llm_7b_ppo \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=2 \
    trainer.total_epochs=15 $@
"""

VERL_YAML = {
    "data": {"train_files": ["/data/train.parquet"], "train_batch_size": 64, "max_response_length": 256},
    "actor_rollout_ref": {"model": {"path": "/models/qwen", "lora_rank": 32, "lora_alpha": 16},
                          "actor": {"ppo_mini_batch_size": 16, "policy_loss": {"loss_mode": "gspo"}},
                          "rollout": {"n": 8, "tensor_model_parallel_size": 1}},
    "critic": {"ppo_mini_batch_size": "${actor_rollout_ref.actor.ppo_mini_batch_size}"},
    "algorithm": {"adv_estimator": "rloo", "use_kl_in_reward": True, "kl_penalty": "mse"},
    "trainer": {"project_name": "p", "experiment_name": "e", "n_gpus_per_node": 4, "nnodes": 1, "save_freq": -1},
}


def _migrated(path: Path, overrides: list[str]) -> str:
    """`rlkit migrate`'s text for `path`, as the command builds it."""
    with as_rlkit_file(path, REGISTRY.trinity_algorithms, overrides, REGISTRY.verl_estimators) as (source, head):
        text, _ = migrate(source, overrides, REGISTRY)
    return head + text


def _said(text: str) -> dict[str, str]:
    """{verl key: what became of it} from the header."""
    return {line[4:].split(":", 1)[0]: line.split("  -> ", 1)[1] for line in text.splitlines()
            if line.startswith("#   ") and "  -> " in line}


def test_a_grpo_script_becomes_an_rlkit_config_that_renders(tmp_path: Path, site: list[str]) -> None:
    script = tmp_path / "run_grpo.sh"
    script.write_text(GRPO_SCRIPT)
    text = _migrated(script, site)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    config = prepare(clean, [], dry_run=True).config
    assert config.type == "grpo" and config.allocation_mode == "vllm:d2t2+fsdp:d4"
    assert (config.cluster.n_nodes, config.cluster.n_gpus_per_node) == (1, 8)
    norm = config.actor.reward_norm
    assert norm is not None and (norm.mean_level, norm.std_level, norm.eps) == ("group", "group", 1e-6)
    assert (config.actor.kl_loss_coef, config.actor.kl_loss_type) == (0.001, "k3")
    assert (config.actor.ppo_n_minibatches, config.train_dataset.batch_size) == (4, 512)  # 512 / 128
    assert (config.gconfig.n_samples, config.gconfig.max_new_tokens, config.train_dataset.max_length) == (5, 1024, 512)
    assert (config.actor.eps_clip_higher, config.actor.optimizer.lr) == (0.28, 1e-6)  # ++key= and 1e-6
    assert (config.experiment_name, config.trial_name) == ("verl_grpo_gsm8k", "qwen2.5_3b-grpo")
    assert (config.recover.freq_steps, config.evaluator.freq_steps, config.evaluator.eval_on_startup) == (20, 5, False)
    assert config.stats_logger.wandb.mode == "online" and config.vllm.gpu_memory_utilization == 0.6
    assert (config.reward.fn, config.reward.answer_key) == ("math", ANSWER)  # verl's rows, read as they are
    said = _said(text)
    assert said["actor_rollout_ref.actor.fsdp_config.param_offload"] == "left out (rlkit offloads nothing)"
    assert said["actor_rollout_ref.actor.made_up_knob"].startswith("unknown:")
    assert "rlkit runs 2 server(s) of 2 GPU(s) and a 4-GPU trainer" in said["actor_rollout_ref.rollout.name"]
    assert said["actor_rollout_ref.actor.kl_loss_type"].startswith("moved to actor.kl_loss_type as k3")
    # the environment's variables stay as written, each named; the script's own are expanded, each said
    assert "#   $HOME in data.train_files\n" in text and "#   $HOME in data.val_files\n" in text
    assert "#   $MODEL = Qwen/Qwen2.5-3B-Instruct (line 5)\n" in text and "$MODEL in" not in text
    assert "VLLM_ATTENTION_BACKEND" not in said and "tee" not in text and "$@" not in text
    assert "not key=value" not in text  # 2>&1 ends the command as | does
    rendered = run_rlkit("render", str(clean))
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr


def test_the_script_alone_keeps_the_environment_s_variables_as_text(tmp_path: Path) -> None:
    script = tmp_path / "run_grpo.sh"
    script.write_text(GRPO_SCRIPT)
    run = read_script(GRPO_SCRIPT, "t")
    assert run.leaves["data.train_files"] == "$HOME/data/gsm8k/train.parquet"
    assert run.leaves["data.val_files"] == "$HOME/data/gsm8k/test.parquet"  # ${HOME}: not an OmegaConf reference
    assert run.leaves["trainer.logger"] == ["console", "wandb"] and run.leaves["trainer.val_before_train"] is False
    mapping, _ = verl_to_rlkit(run.leaves, "t", REGISTRY.verl_estimators)
    assert mapping["train_dataset"]["path"] == "$HOME/data/gsm8k/train.parquet"
    assert mapping["actor"]["path"] == "Qwen/Qwen2.5-3B-Instruct"  # the script's own MODEL, expanded


def test_a_ppo_script_with_a_critic(tmp_path: Path, site: list[str]) -> None:
    script = tmp_path / "run_ppo.sh"
    script.write_text(PPO_SCRIPT)
    text = _migrated(script, [o for o in site if not o.startswith("valid_dataset")])
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    config = prepare(clean, [], dry_run=True).config
    assert config.type == "ppo" and config.allocation_mode == "sglang:d2t4+fsdp:d8"  # 16 GPUs: 8 serve, 8 train
    assert config.cluster.n_nodes == 2 and config.sglang.mem_fraction_static == 0.4
    assert (config.critic.optimizer.lr, config.critic.eps_clip, config.critic.gradient_checkpointing) == \
        (1e-5, 0.5, True)
    assert config.actor.ppo_n_minibatches == config.critic.ppo_n_minibatches == 4  # verl's critic takes the actor's
    assert config.actor.adv_norm is not None and config.actor.adv_norm.mean_level == "batch"
    assert config.actor.reward_norm is None
    assert _said(text)["critic.ppo_micro_batch_size_per_gpu"].startswith("left out (")


def test_a_verl_yaml_config(tmp_path: Path) -> None:
    """Nested keys, a `${...}` to verl's own key resolved; rloo, LoRA's rank, GSPO's loss mode, the KL reward."""
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump(VERL_YAML))
    with as_rlkit_file(path, REGISTRY.trinity_algorithms, [], REGISTRY.verl_estimators) as (source, head):
        mapping = yaml.safe_load(source.read_text())
    assert mapping["type"] == "grpo" and mapping["allocation_mode"] == "vllm:d2+fsdp:d2"
    assert mapping["actor"]["reward_norm"] == {"mean_level": "group", "mean_leave1out": True, "std_level": None}
    assert (mapping["actor"]["use_lora"], mapping["actor"]["lora_rank"], mapping["actor"]["lora_alpha"]) == \
        (True, 32, 16)
    assert mapping["actor"]["importance_sampling_level"] == "sequence"
    assert (mapping["actor"]["kl_ctl"], mapping["actor"]["kl_estimator"]) == (0.001, "k2")
    assert mapping["actor"]["ppo_n_minibatches"] == 4 and mapping["critic"]["ppo_n_minibatches"] == 4
    assert mapping["train_dataset"]["path"] == "/data/train.parquet" and "recover" not in mapping
    assert head.startswith("# verl run ppo_trainer.yaml") and "trainer.save_freq: -1  -> left out (" in head


def test_what_rlkit_cannot_take_exits_2_naming_each_problem_and_its_fix(tmp_path: Path, site: list[str]) -> None:
    script = tmp_path / "run.sh"
    script.write_text(PPO_SCRIPT.replace("=gae", "=remax").replace("ppo_mini_batch_size=256",
                                                                                  "ppo_mini_batch_size=300"))
    site = [o for o in site if not o.startswith("valid_dataset")]  # the script has no val_files
    refused = run_rlkit("migrate", str(script), *site)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    said = refused.stderr
    said = " ".join(said.split())
    assert "algorithm.adv_estimator 'remax'" in said and "not built in rlkit: its baseline is the reward of a " \
        "greedy completion of each prompt" in said
    assert "use grpo, grpo_vectorized, rloo, rloo_vectorized, grpo_passk, opo, gpg, reinforce_plus_plus, " \
        "reinforce_plus_plus_baseline or gae" in said
    assert "actor_rollout_ref.actor.ppo_mini_batch_size 300" in said and "not a multiple" in said
    assert "make it divide 1024 (e.g. 256), or pass actor.ppo_n_minibatches=N" in said
    assert refused.stdout == ""
    # the override the fix names is taken
    script.write_text(PPO_SCRIPT.replace("ppo_mini_batch_size=256", "ppo_mini_batch_size=300"))
    done = run_rlkit("migrate", str(script), *site, "actor.ppo_n_minibatches=2")
    assert done.returncode == 0, done.stderr
    assert "ppo_n_minibatches: 2" in done.stdout and "your actor.ppo_n_minibatches override is used" in done.stdout


@pytest.mark.parametrize("change, says", [
    ({"actor_rollout_ref.actor.kl_loss_type": "abs"}, "not one of rlkit's KL estimators"),
    ({"actor_rollout_ref.actor.kl_loss_coef": "lots"}, "kl_loss_coef 'lots' (t): not a number >= 0"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": ["gspo"]}, "loss_mode ['gspo'] (t): not built"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "clip_cov"},
     "loss_mode 'clip_cov' (t): not built in rlkit\n  fix: use vanilla, gspo, sapo, cispo, geo_mean or gpg"),
    ({"actor_rollout_ref.rollout.name": "hf"}, "rlkit's servers are vLLM or SGLang"),
    ({"actor_rollout_ref.rollout.tensor_model_parallel_size": 8}, "leaves the trainer none of the run's 8"),
    ({"data.train_files": ["a.parquet", "b.parquet"]}, "2 files: rlkit reads one file per dataset"),
    ({"custom_reward_function.path": "/r.py"}, "rlkit calls fn(prompt, completion, row)"),
    ({"algorithm.kl_ctrl.type": "pid"}, "kl_ctrl.type 'pid' (t): not one of verl's KL controllers"),
    ({"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.horizon": 0},
     "kl_ctrl.horizon 0 (t): not a whole number > 0"),
    ({"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.target_kl": "x"},
     "kl_ctrl.target_kl 'x' (t): not a number > 0"),
    ({"trainer.resume_mode": "resume_path"}, "rlkit resumes a trial by its name"),
])
def test_hostile_or_unbuilt_values_are_named(change: dict[str, object], says: str) -> None:
    leaves = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.use_kl_loss": True, **change}
    with pytest.raises(ConfigError) as info:
        verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators)
    assert says in str(info.value), str(info.value)


def test_the_adaptive_kl_controller_moves_with_the_kl_reward() -> None:
    """verl's kl_ctrl.type adaptive adapts the KL reward's coefficient: with use_kl_in_reward it becomes
    actor.kl_ctl_adaptive (target_kl and horizon, verl's defaults 0.1 and 10000 where unset), kl_coef its start;
    without the KL reward, or with kl_coef 0 (nothing to multiply), it is left out with why."""
    on = {"algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive",
          "algorithm.kl_ctrl.kl_coef": 0.02, "algorithm.kl_ctrl.target_kl": 0.05}
    out, fates = verl_to_rlkit(on, "t", REGISTRY.verl_estimators)
    assert out["actor"]["kl_ctl"] == 0.02 and out["actor"]["kl_ctl_adaptive"] == {"target_kl": 0.05, "horizon": 10000}
    said = {f.key: f.fate for f in fates}
    assert said["algorithm.kl_ctrl.type"].startswith("moved to actor.kl_ctl_adaptive") and \
        "horizon 10000, verl's default" in said["algorithm.kl_ctrl.type"]
    assert said["algorithm.kl_ctrl.target_kl"] == "moved to actor.kl_ctl_adaptive.target_kl"
    out, _ = verl_to_rlkit({**on, "algorithm.kl_ctrl.horizon": 500}, "t", REGISTRY.verl_estimators)
    assert out["actor"]["kl_ctl_adaptive"] == {"target_kl": 0.05, "horizon": 500}
    loaded = config_from_mapping({"experiment_name": "e", "trial_name": "t", "type": "grpo",
                                  "allocation_mode": "vllm:d1+fsdp:d1", "actor": out["actor"]}, [])
    assert loaded.actor.kl_ctl_adaptive == KLControlConfig(target_kl=0.05, horizon=500)  # rlkit's schema reads it
    for change, why in (({"algorithm.use_kl_in_reward": False}, "use_kl_in_reward is false"),
                        ({"algorithm.kl_ctrl.kl_coef": 0}, "kl_coef is 0"),
                        ({"algorithm.kl_ctrl.type": "fixed"}, "algorithm.kl_ctrl.type is fixed")):
        out, fates = verl_to_rlkit({**on, **change}, "t", REGISTRY.verl_estimators)
        assert "kl_ctl_adaptive" not in out.get("actor", {}), change
        said = {f.key: f.fate for f in fates}
        assert said["algorithm.kl_ctrl.target_kl"].startswith("left out (") and why in \
            said["algorithm.kl_ctrl.target_kl"], said


def test_gpus_split_between_servers_and_trainer() -> None:
    assert [split(8, 2), split(8, 1), split(16, 8), split(8, 4)] == [(2, 4), (4, 4), (1, 8), (1, 4)]
    assert split(1, 1) is None and split(8, 8) is None


def test_detection_leaves_trinity_and_other_files_alone(tmp_path: Path) -> None:
    trinity = tmp_path / "trinity.yaml"  # Trinity-RFT has an algorithm section too
    trinity.write_text(yaml.safe_dump({"algorithm": {"algorithm_type": "grpo", "adv_estimator": "grpo"},
                                       "buffer": {"batch_size": 4}, "model": {"model_path": "/m"}}))
    with as_rlkit_file(trinity, REGISTRY.trinity_algorithms, [], REGISTRY.verl_estimators) as (_, head):
        assert head.startswith("# Trinity-RFT config")
    other = tmp_path / "train.sh"
    other.write_text("torchrun train.py lr=1e-5\n")
    done = run_rlkit("migrate", str(other))
    assert done.returncode == 2 and "runs no verl.trainer.main_ppo command" in done.stderr, done.stderr
    two = tmp_path / "two.sh"
    two.write_text("python3 -m verl.trainer.main_ppo a.b=1\npython3 -m verl.trainer.main_ppo a.b=2\n")
    with pytest.raises(ConfigError, match=r"2 commands that run verl.trainer.main_ppo \(lines 1, 2\)"):
        read_script(two.read_text(), "t")
    with pytest.raises(ConfigError, match="line 1 cannot be split into words"):
        read_script("python3 -m verl.trainer.main_ppo data.x='open\n", "t")


def test_the_key_map_is_the_source_of_the_names() -> None:
    """Every key the conversions read is a row of the key map (the docs page), and Trinity-RFT's embedded verl
    trainer config is read by the same rows."""
    import inspect

    from rlkit.config.verl import layout, rules

    rows = {their: ours for their, ours, _ in VERL_KEYS}
    code = inspect.getsource(rules) + inspect.getsource(layout)
    for name, value in (("ACTOR", rules.ACTOR), ("ROLLOUT", rules.ROLLOUT), ("ARR", rules.ARR)):
        code = code.replace("{" + name + "}", value)
    read = set(re.findall(r'"((?:actor_rollout_ref|algorithm|data|trainer|critic|custom_reward_function)'
                          r'\.[A-Za-z_.]+)"', code))
    read -= {rules.ACTOR, rules.ROLLOUT, *rows.values()}  # the prefixes, and rlkit's keys (critic.*)
    assert len(read) > 30 and not read - set(rows), sorted(read - set(rows))
    # Trinity-RFT's embedded verl config: the keys its trainer reads as verl does move by the same rows
    from tests.unit.config.test_trinity_migrate import _to_rlkit, _trinity

    read_as_verl = ("actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.model.enable_gradient_checkpointing",
                    "critic.optim.lr", "critic.grad_clip", "critic.ppo_max_token_len_per_gpu")
    _, fates = _to_rlkit(_trinity(**{"algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": None,
                                     **{f"trainer.trainer_config.{key}": 2 for key in read_as_verl}}), "t")
    said = {f.key: f.fate for f in fates}
    assert all(said[f"trainer.trainer_config.{key}"] == f"moved to {rows[key]}" for key in read_as_verl), said


def test_a_validation_set_is_evaluated_before_training_as_verl_does() -> None:
    """verl's val_before_train defaults to true: with val_files and no trigger, rlkit's evaluator would never run
    (render refuses a valid_dataset it would ignore), so verl's default is written and said."""
    mapping, fates = verl_to_rlkit({"algorithm.adv_estimator": "grpo", "data.val_files": "/v.parquet"}, "t",
                                   REGISTRY.verl_estimators)
    assert mapping["evaluator"] == {"eval_on_startup": True} and mapping["valid_dataset"] == {"path": "/v.parquet"}
    assert {f.key: f.fate for f in fates}["trainer.val_before_train"].endswith("verl's default")
    mapping, _ = verl_to_rlkit({"data.val_files": "/v.parquet", "trainer.val_before_train": False}, "t",
                               REGISTRY.verl_estimators)
    assert mapping["evaluator"] == {"eval_on_startup": False}


def test_a_validation_set_verl_never_evaluates_is_left_out() -> None:
    """verl validates before training (val_before_train) or every test_freq > 0 steps, else never, though its
    example ppo_trainer/run_qwen3-8b_npu.sh names val_files: the set is left out saying why (it was written with
    eval_gconfig, and rlkit's own check refused the file for an evaluator that never runs); a valid_dataset.path
    override then is refused naming verl's keys, and an evaluator trigger of the user's takes the set as before."""
    run = {"algorithm.adv_estimator": "grpo", "data.val_files": ["/a.parquet", "/b.parquet"],
           "trainer.test_freq": -1, "trainer.val_before_train": False, f"{VAL}.do_sample": True, f"{VAL}.n": 4}
    mapping, fates = verl_to_rlkit(run, "t", REGISTRY.verl_estimators)
    said = {f.key: f.fate for f in fates}
    assert "valid_dataset" not in mapping and "eval_gconfig" not in mapping
    assert said["data.val_files"] == "left out (verl never validates this run: trainer.test_freq -1 and " \
                                     "trainer.val_before_train false (verl/trainer/ppo/ray_trainer.py fit))"
    assert said[f"{VAL}.n"] == "left out (verl never validates this run)"
    with pytest.raises(ConfigError, match=r"data.val_files .*verl never validates.* your valid_dataset.path would "
                                          r"be ignored") as refused:
        verl_to_rlkit(run, "t", REGISTRY.verl_estimators, {"valid_dataset.path"})
    assert "evaluator.freq_steps=N" in str(refused.value.hint)
    mapping, _ = verl_to_rlkit(run, "t", REGISTRY.verl_estimators, {"valid_dataset.path", "evaluator.freq_steps"})
    assert mapping["eval_gconfig"]["n_samples"] == 4
    for on in ({"trainer.test_freq": 5}, {"trainer.val_before_train": True}):
        mapping, _ = verl_to_rlkit({**run, "data.val_files": "/v.parquet", **on}, "t", REGISTRY.verl_estimators)
        assert mapping["valid_dataset"] == {"path": "/v.parquet"} and mapping["eval_gconfig"]["n_samples"] == 4


def test_hydra_references_and_verl_defaults_in_a_script() -> None:
    """`'${trainer.project_name}'` (quoted away from the shell) is Hydra's reference to the run's own key, resolved;
    clip_ratio_low wins over clip_ratio as in verl; the run's shape keeps verl's defaults where the script is silent."""
    run = read_script("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo trainer.project_name=pp "
                      "trainer.default_local_dir='/ckpt/${trainer.project_name}' "
                      "actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio=0.3", "t")
    assert run.leaves["trainer.default_local_dir"] == "/ckpt/pp" and not run.variables
    mapping, fates = verl_to_rlkit(run.leaves, "t", REGISTRY.verl_estimators)
    assert mapping["cluster"]["fileroot"] == "/ckpt/pp" and mapping["actor"]["eps_clip"] == 0.2
    assert (mapping["train_dataset"], mapping["gconfig"]["max_new_tokens"]) == \
        ({"batch_size": 1024, "max_length": 512}, 512)
    assert (mapping["experiment_name"], mapping["trial_name"]) == ("pp", "gsm8k")
    assert {f.key: f.fate for f in fates}["actor_rollout_ref.actor.clip_ratio"].startswith("left out (clip_ratio_low")


def _reinforce_pp_reference(rewards: list[float], lengths: list[int], group_size: int, *, baseline: bool,
                            kl: list[list[float]] | None = None, beta: float = 0.0, gamma: float = 1.0) -> list[float]:
    """REINFORCE++ (arXiv 2501.03262) from its definition, in plain Python: each token's return (the outcome reward
    on the last token, `-beta * kl` on every token, discounted by `gamma`), or in the baseline form the reward minus
    its group's mean on every token; then whitened over the batch's tokens (mean, unbiased variance)."""
    per_token: list[list[float]] = []
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        if baseline:
            start = i - i % group_size
            mean = sum(rewards[start:start + group_size]) / group_size
            per_token.append([r - mean] * n)
            continue
        token_rewards = [-beta * (kl[i][t] if kl else 0.0) for t in range(n)]
        token_rewards[-1] += r
        returns, running = [0.0] * n, 0.0
        for t in reversed(range(n)):
            running = token_rewards[t] + gamma * running
            returns[t] = running
        per_token.append(returns)
    flat = [a for row in per_token for a in row]
    mean = sum(flat) / len(flat)
    std = (sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)) ** 0.5
    return [(a - mean) / std for a in flat]


@pytest.mark.parametrize(("estimator", "kl_in_reward"), [("reinforce_plus_plus", False),
                                                         ("reinforce_plus_plus", True),
                                                         ("reinforce_plus_plus_baseline", False)])
def test_reinforce_plus_plus_migrates_to_settings_whose_advantages_are_reinforce_plus_plus(
        tmp_path: Path, site: list[str], estimator: str, kl_in_reward: bool) -> None:
    """verl's REINFORCE++ and REINFORCE++-baseline become grpo with reward_norm/adv_norm settings, and rlkit's own
    advantage code under those settings gives the estimator's advantages (computed here from the paper's
    definition) on a batch of two groups with different lengths, with the KL reward penalty too."""
    from rlkit.trainer.rl_math.advantage_batch import prepare_batch, token_advantages
    from rlkit.types import Sample

    script = tmp_path / "run.sh"
    kl_words = "algorithm.use_kl_in_reward=True algorithm.kl_ctrl.kl_coef=0.05 algorithm.kl_penalty=kl " \
               "actor_rollout_ref.actor.use_kl_loss=False " if kl_in_reward else ""
    script.write_text(GRPO_SCRIPT.replace("algorithm.adv_estimator=grpo", f"algorithm.adv_estimator={estimator} "
                                          "algorithm.gamma=0.9" + (" " + kl_words if kl_words else ""))
                      .replace("    algorithm.use_kl_in_reward=False \\\n", "")
                      .replace("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.use_kl_loss="
                               + ("False" if kl_in_reward else "True")))
    text = _migrated(script, site)
    assert "as grpo" in _said(text)["algorithm.adv_estimator"], _said(text)["algorithm.adv_estimator"]
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    actor = prepare(clean, [], dry_run=True).config.actor
    baseline = estimator.endswith("baseline")
    assert actor.kl_ctl == (0.05 if kl_in_reward else 0.0) and actor.gae_lambda == 1.0
    # the baseline form spreads one value over the tokens: verl does not read gamma there, rlkit keeps discount 1
    assert actor.discount == (1.0 if baseline else 0.9)
    if baseline:
        assert _said(text)["algorithm.gamma"].startswith("left out (verl's reinforce_plus_plus_baseline advantage "
                                                         "does not read it"), _said(text)["algorithm.gamma"]
    group_size, rewards, lengths = 5, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], [3, 5, 2, 4, 6, 1, 3, 2, 5, 4]
    behav = [[-0.1 * (t + 1) - 0.01 * i for t in range(n)] for i, n in enumerate(lengths)]
    ref = {i: [b - 0.02 * (t % 3) for t, b in enumerate(row)] for i, row in enumerate(behav)}
    old = {i: [b + 0.01 for b in row] for i, row in enumerate(behav)}
    samples = [Sample(prompt_ids=[1, 2], completion_ids=[5] * n, behav_logp=behav[i], reward=r, version=0,
                      finished=True, group=i // group_size) for i, (r, n) in enumerate(zip(rewards, lengths,
                                                                                             strict=True))]
    groups = [samples[:group_size], samples[group_size:]]
    batch = prepare_batch(groups, actor, max_new_tokens=8).samples
    token_advantages(batch, old, ref, actor)
    got = [a for s in batch for a in (s.token_advantages or [])]
    kl = [[old[i][t] - ref[i][t] for t in range(n)] for i, n in enumerate(lengths)]  # k1 on the recomputed
    expected = _reinforce_pp_reference(rewards, lengths, group_size, baseline=baseline, kl=kl, beta=actor.kl_ctl,
                                       gamma=0.9)
    assert got == pytest.approx(expected, abs=1e-4)  # rlkit adds eps 1e-5 to the std, verl 1e-8 to the variance


def test_reinforce_plus_plus_baseline_with_the_kl_in_its_reward_migrates_by_the_summed_penalty(
        tmp_path: Path, site: list[str]) -> None:
    """Refused until verl's summed form was built (actor.kl_penalty_level: sequence; its advantages against verl's
    definition: tests/unit/config/test_verl_estimators.py): the command line migrates, exit 0, and says so."""
    script = tmp_path / "run.sh"
    script.write_text(GRPO_SCRIPT.replace("algorithm.adv_estimator=grpo",
                                          "algorithm.adv_estimator=reinforce_plus_plus_baseline")
                      .replace("algorithm.use_kl_in_reward=False", "algorithm.use_kl_in_reward=True"))
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["actor"]["kl_penalty_level"] == "sequence"
    assert "actor.kl_penalty_level: sequence" in " ".join(done.stdout.split())


def test_verl_rows_answer_and_its_default_scorer_are_written_and_said(tmp_path: Path) -> None:
    """verl's reward reads row['reward_model']['ground_truth'] and scores GSM8K and MATH rows by their final answer:
    the migrated run reads the nested answer with rlkit's math, both said in the header with why; the user's
    overrides of either stand, and the header then claims neither."""
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
                      "data.train_files=/d/train.parquet\n")
    text = _migrated(script, [])
    mapping = yaml.safe_load(text)
    assert mapping["reward"] == {"answer_key": ANSWER, "fn": "math"}
    notes = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    assert f"Your data: reward.answer_key is {ANSWER}: verl's preprocessing scripts" in notes
    assert "where verl's reward reads it" in notes and "chat template" in notes
    assert "The reward: reward.fn math. verl's default_compute_score" in notes
    assert "openai/gsm8k" in notes and "DigitalLearningGmbH/MATH-lighteval" in notes and "'#### '" in notes
    said = text[text.index("# Your data"):text.index("\n\n")].splitlines()
    assert len(said) > 4 and all(len(line) <= 120 and line.startswith("# ") for line in said)
    mapping, _ = verl_to_rlkit({"algorithm.adv_estimator": "grpo"}, "t", REGISTRY.verl_estimators,
                               {"reward.answer_key", "reward.fn"})
    assert "reward" not in mapping  # the overrides are applied over the mapping by migrate
    text = _migrated(script, ["reward.answer_key=solution", "reward.fn=exact_match"])
    assert yaml.safe_load(text)["reward"] == {"answer_key": "solution", "fn": "exact_match"}
    assert "your reward.answer_key override names" in text and "your reward.fn override scores" in text
    assert "reward.fn math" not in text and f"reward.answer_key is {ANSWER}" not in text
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
                      "custom_reward_function.path=/r.py\n")
    text = _migrated(script, ["reward.fn=/r.py:score"])
    assert yaml.safe_load(text)["reward"] == {"answer_key": ANSWER, "fn": "/r.py:score"}
    assert "The reward:" not in text and "your reward.fn override is used" in text


def test_the_scorer_column_key_is_left_out_saying_how_rlkit_scores() -> None:
    run = read_script("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.reward_fn_key=data_source "
                      "data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 "
                      "actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                      "trainer.n_gpus_per_node=4 trainer.nnodes=1", "t")
    _, fates = verl_to_rlkit(run.leaves, "t", REGISTRY.verl_estimators)
    said = {f.key: f.fate for f in fates}
    assert said["data.reward_fn_key"].startswith("left out (the row column by which verl picks a scorer"), said
    assert "reward.fn" in said["data.reward_fn_key"]


def test_a_migration_writes_no_knob_its_own_check_refuses_as_ignored(tmp_path: Path, site: list[str]) -> None:
    """LoRA's alpha and target modules with lora_rank 0 (LoRA off), and a KL estimator whose coefficient is 0, are
    left out (named in the header): written, rlkit would refuse them as ignored (rlkit.checks.conditional_knobs)."""
    data = copy.deepcopy(VERL_YAML)
    data["actor_rollout_ref"]["model"] = {"path": "/models/qwen", "lora_rank": 0, "lora_alpha": 32,
                                          "target_modules": ["q_proj", "v_proj"]}
    data["algorithm"]["kl_ctrl"] = {"kl_coef": 0.0}
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump(data))
    text = _migrated(path, [o for o in site if not o.startswith("valid_dataset.")])  # the file evaluates nothing
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    actor = prepare(clean, [], dry_run=True).config.actor
    assert (actor.use_lora, actor.lora_alpha, actor.target_modules) == (False, 16, [])  # the defaults
    assert (actor.kl_ctl, actor.kl_estimator) == (0.0, "k1")
    said = _said(text)
    assert said["actor_rollout_ref.model.lora_alpha"].startswith("left out (LoRA is off")
    assert said["actor_rollout_ref.model.target_modules"].startswith("left out (LoRA is off")
    assert said["algorithm.kl_penalty"].startswith("left out (algorithm.kl_ctrl.kl_coef is 0")


@pytest.mark.parametrize(("given", "written"), [("all-linear", ["all-linear"]),
                                                ("q_proj, v_proj", ["q_proj", "v_proj"]),
                                                (["q_proj", "k_proj"], ["q_proj", "k_proj"])])
def test_lora_target_modules_as_verl_writes_them_become_rlkit_s_list(tmp_path: Path, site: list[str], given: Any,
                                                                      written: list[str]) -> None:
    """verl's target_modules is a string by default (all-linear) or a list; rlkit's field is a list, so verl's own
    LoRA command line (model.target_modules=all-linear) failed to load on the field's type."""
    data = copy.deepcopy(VERL_YAML)
    data["actor_rollout_ref"]["model"] = {"path": "/models/qwen", "lora_rank": 32, "lora_alpha": 32,
                                          "target_modules": given}
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump(data))
    text = _migrated(path, [o for o in site if not o.startswith("valid_dataset.")])
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    actor = prepare(clean, [], dry_run=True).config.actor
    assert (actor.use_lora, actor.lora_rank, actor.target_modules) == (True, 32, written)

"""`rlkit migrate` reads Trinity-RFT's configs (issue 49 item 6): a Trinity-RFT-shaped file (written from its
configuration guide, ../shared/seeds/trinity-rft-config-guide.md) migrates to the rlkit fields of its synchronizer,
algorithm, model and buffer keys, every key left out is named in the header, the sync styles rlkit has not built are
refused naming why, and a file that is neither AReaL's nor Trinity-RFT's exits 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkit.cli.key_maps import TRINITY
from rlkit.config.trinity import RENAMES, SYNC_METHODS, TrinityKey, as_rlkit_file, trinity_to_rlkit
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit
from tests.helpers.dotted_changes import with_changes

SITE = ["launcher.slurm.container_type=none"]


def _trinity(**changes: Any) -> dict[str, Any]:
    """An OPMD run as Trinity-RFT's guide writes one; `changes`: {"section.key": value} (None removes it)."""
    data: dict[str, Any] = {
        "project": "trinity-demo", "name": "opmd-run", "mode": "both", "checkpoint_root_dir": "/tmp/rlkit-ckpt",
        "continue_from_checkpoint": True,
        "algorithm": {"algorithm_type": "opmd", "repeat_times": 8,
                      "optimizer": {"lr": 1e-6, "lr_scheduler_type": "constant"},
                      "advantage_fn_args": {"opmd_baseline": "logavgexp", "tau": 2.0}, "entropy_loss_fn": "default"},
        "model": {"model_path": "/tmp/model", "max_response_tokens": 64},
        "cluster": {"node_num": 1, "gpu_per_node": 8},
        "buffer": {"batch_size": 16, "total_epochs": 2,
                   "explorer_input": {"taskset": {"name": "train", "storage_type": "file", "path": "/tmp/d.jsonl",
                                                  "format": {"prompt_key": "question"},
                                                  "rollout_args": {"temperature": 1.0}},
                                      "eval_tasksets": [{"name": "eval", "path": "/tmp/e.jsonl"}],
                                      "default_reward_fn_type": "countdown_reward"},
                   "trainer_input": {"experience_buffer": {"name": "buf", "storage_type": "queue"}}},
        "explorer": {"eval_interval": 10,
                     "rollout_model": {"engine_type": "vllm_async", "engine_num": 2, "tensor_parallel_size": 2}},
        "synchronizer": {"sync_method": "nccl", "sync_interval": 4, "sync_offset": 1, "sync_timeout": 1200,
                         "sync_style": "fixed"},
        "trainer": {"save_interval": 100, "grad_clip": 1.0, "ulysses_sequence_parallel_size": 1},
    }
    return with_changes(data, changes)


def _to_rlkit(data: dict[str, Any], source: str) -> tuple[dict[str, Any], list[TrinityKey]]:
    """trinity_to_rlkit with the registered job types' Trinity-RFT names, as `rlkit migrate` calls it."""
    return trinity_to_rlkit(data, source, REGISTRY.trinity_algorithms)


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def migrated_config(tmp_path: Path, data: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """A Trinity-RFT file migrated as `rlkit migrate` does and loaded as rlkit loads it (render's checks run), and
    each Trinity-RFT key's fate."""
    from rlkit.config.areal.migrate import migrate

    with as_rlkit_file(_write(tmp_path, data), REGISTRY.trinity_algorithms) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    _, fates = _to_rlkit(data, "trinity.yaml")
    return prepare(clean, [], dry_run=True).config, {f.key: f.fate for f in fates}


def test_a_trinity_config_migrates_to_rlkit_fields(tmp_path: Path) -> None:
    from rlkit.config.areal.migrate import migrate

    with as_rlkit_file(_write(tmp_path, _trinity()), REGISTRY.trinity_algorithms) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    config = prepare(clean, [], dry_run=True).config
    assert (config.type, config.experiment_name, config.trial_name) == ("opmd", "trinity-demo", "opmd-run")
    assert (config.actor.weight_update_interval, config.actor.weight_update_offset) == (4, 1)
    assert (config.actor.weight_update_mode, config.actor.weight_update_timeout) == ("xccl", 1200)
    assert (config.opmd.tau, config.opmd.opmd_baseline) == (2.0, "logavgexp")
    assert config.allocation_mode == "vllm:d2t2+fsdp:d4"
    assert (config.train_dataset.path, config.train_dataset.batch_size, config.train_dataset.prompt_key) == \
        ("/tmp/d.jsonl", 16, "question")
    assert (config.valid_dataset.path, config.evaluator.freq_steps) == ("/tmp/e.jsonl", 10)
    assert (config.gconfig.n_samples, config.gconfig.max_new_tokens, config.actor.optimizer.lr) == (8, 64, 1e-6)
    assert (config.recover.mode, config.saver.freq_steps, config.cluster.fileroot) == ("auto", 100, "/tmp/rlkit-ckpt")
    assert "#   synchronizer.sync_method: nccl  -> moved to actor.weight_update_mode as xccl" in header
    assert "#   algorithm.entropy_loss_fn: default  -> moved to actor.entropy_coeff as its entropy_coef 0.0, " \
        "Trinity-RFT's default entropy_coef 0: off" in header
    assert config.actor.entropy_coeff == 0.0
    assert config.actor.fsdp.ulysses_sp_size == 1 and "trainer.ulysses_sequence_parallel_size: 1  -> " in header
    for left_out in ("buffer.explorer_input.default_reward_fn_type", "buffer.trainer_input.experience_buffer.name",
                     "synchronizer.sync_style", "mode"):
        assert f"#   {left_out}: " in header and "left out (" in header.split(f"#   {left_out}: ")[1].split("\n")[0]


def test_mix_is_grpo_with_the_expert_rows() -> None:
    aux = "buffer.trainer_input.auxiliary_buffers"
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.algorithm_type": "mix", "algorithm.advantage_fn_args":
                                                  None, "algorithm.policy_loss_fn_args": {"mu": 0.2},
                                                  f"{aux}.sft_dataset": {"path": "/tmp/sft.jsonl",
                                                                         "format": {"response_key": "answer"}}}), "t")
    assert mapping["type"] == "grpo" and mapping["mix"] == {"mu": 0.2}
    assert mapping["expert_dataset"] == {"path": "/tmp/sft.jsonl"} and mapping["sft"] == {"response_key": "answer"}
    with pytest.raises(ConfigError, match=r"algorithm_type mix .* needs its expert data"):
        _to_rlkit(_trinity(**{"algorithm.algorithm_type": "mix"}), "t")
    assert not [f for f in fates if f.fate.startswith("left out") and f.key.startswith("algorithm.policy")]



@pytest.mark.parametrize(("tools_key", "ours"), [("functions", "functions"), (None, "")])
def test_the_expert_rows_tools_column_moves_to_sft_s(tools_key: str | None, ours: str) -> None:
    """A mix's expert rows (auxiliary_buffers.sft_dataset) are read by sft's row reader (rlkit.jobs.grpo.expert),
    so their format.tools_key is sft.tools_key; without expert rows the mix is off and it is left out."""
    aux = "buffer.trainer_input.auxiliary_buffers.sft_dataset"
    expert = {"path": "/tmp/sft.jsonl", "format": {"tools_key": tools_key}}
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.algorithm_type": "mix", aux: expert}), "t")
    assert mapping["sft"] == {"tools_key": ours}
    assert {f.key: f.fate for f in fates}[f"{aux}.format.tools_key"].startswith("moved to sft.tools_key")
    mapping, fates = _to_rlkit(_trinity(**{f"{aux}.format.tools_key": "functions"}), "t")
    assert "sft" not in mapping and {f.key: f.fate for f in fates}[f"{aux}.format.tools_key"] == (
        "left out (no expert data (auxiliary_buffers.sft_dataset.path): the SFT+RL mix is off)")


@pytest.mark.parametrize("changes, says", [
    ({"synchronizer.sync_style": "explorer_driven"}, "sync_style 'explorer_driven' .* is not built"),
    ({"synchronizer.sync_style": "trainer_driven"}, "sync_style 'trainer_driven' .* is not built"),
    ({"synchronizer.sync_method": "rdma"}, "sync_method 'rdma' .* has no rlkit weight_update_mode"),
    ({"algorithm.algorithm_type": "sapo"}, "algorithm_type 'sapo' .* has no rlkit job type"),
    ({"mode": "train"}, "mode 'train'"),
    ({"explorer.rollout_model.engine_num": 4}, "leave the trainer none"),
])
def test_what_rlkit_has_not_built_is_refused_naming_why(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _to_rlkit(_trinity(**changes), "t")


def test_every_algorithm_type_of_the_guide_is_a_job_types_trinity_name() -> None:
    """The job types' records carry Trinity-RFT's names (rlkit.jobs.base.JobType.trinity): each algorithm_type the
    guide lists becomes the job type whose record names it, mix becoming grpo."""
    for algorithm in ("ppo", "grpo", "opmd", "dpo", "sft", "mix"):
        owner = [job.name for job in REGISTRY if algorithm in job.trinity]
        assert len(owner) == 1, (algorithm, owner)
        assert REGISTRY.trinity_algorithms[algorithm] == owner[0] == ("grpo" if algorithm == "mix" else algorithm)


def test_dynamic_batch_size_is_packing() -> None:
    for value in (False, True):
        mapping, fates = _to_rlkit(_trinity(**{"trainer.use_dynamic_bsz": value,
                                               "trainer.max_token_len_per_gpu": 16384}), "t")
        assert mapping["actor"]["mb_spec"] == {"packing": value, "max_tokens_per_mb": 16384}
        assert not [f for f in fates if f.key == "trainer.use_dynamic_bsz" and f.fate.startswith("left out")]


def test_checkpoint_sync_is_a_disk_push() -> None:
    mapping, _ = _to_rlkit(_trinity(**{"synchronizer.sync_method": "checkpoint"}), "t")
    assert mapping["actor"]["weight_update_mode"] == "disk"


def test_a_problem_names_the_users_file_not_the_temporary_mapping(tmp_path: Path) -> None:
    """migrate reads the Trinity file's rlkit mapping from a temporary file, gone once migrate ends: "add it to
    /tmp/rlkit-trinity-.../trinity.yaml" told the user nothing."""
    from rlkit.errors import ConfigError, ConfigErrors

    user_file = _write(tmp_path, _trinity())
    with pytest.raises(ConfigErrors) as raised, as_rlkit_file(user_file, REGISTRY.trinity_algorithms) as (source, _):
        assert source != user_file
        raise ConfigErrors([ConfigError("required field 'x' is not set", hint=f"add it to {source}")])
    assert str(raised.value) == f"required field 'x' is not set\n  fix: add it to {user_file}"


def test_on_the_command_line(tmp_path: Path) -> None:
    refused = run_rlkit("migrate", str(_write(tmp_path, _trinity(**{"synchronizer.sync_style": "trainer_driven"}))),
                        *SITE)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "not built" in refused.stderr and "sync_style" in refused.stderr
    neither = tmp_path / "neither.yaml"
    neither.write_text("runtime:\n  steps: 3\nmodels:\n  policy: {}\n")
    done = run_rlkit("migrate", str(neither))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "neither an rlkit (AReaL) config nor a Trinity-RFT config" in done.stderr
    unresolved = run_rlkit("migrate", str(_write(tmp_path, _trinity(**{"model.model_path":
                                                                        "${oc.env:RLKIT_TEST_SURELY_UNSET}"}))), *SITE)
    assert unresolved.returncode == 2 and "Traceback" not in unresolved.stderr, unresolved.stderr
    assert "model.model_path: '${oc.env:RLKIT_TEST_SURELY_UNSET}'" in unresolved.stderr
    assert "export RLKIT_TEST_SURELY_UNSET" in unresolved.stderr


def test_the_key_map_page_says_what_migrate_does() -> None:
    """rlkit/cli/key_maps.py's Trinity-RFT table (the docs) agrees with the keys migrate moves."""
    documented = {entry.their: entry.ours for entry in TRINITY}
    for their, ours in RENAMES.items():
        if their in documented:
            assert documented[their] == ours, their
    assert documented["synchronizer.sync_method"] == "actor.weight_update_mode"
    assert {"nccl": "xccl", "checkpoint": "disk"}.items() <= SYNC_METHODS.items()
    for their, ours in documented.items():
        if their.startswith("synchronizer.") and ours:
            assert their in RENAMES or their == "synchronizer.sync_method", their


# Trinity-RFT reads kl_penalty_fn where its trainer computes the advantages: ppo (rlkit.config.trinity_terms)
_PPO = {"algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": None}


def test_kl_functions_become_rlkit_estimators_with_their_coefficients() -> None:
    """Trinity-RFT's KL_FN names: k1/k2/k3 keep their name, low_var_kl is k3 (clamped at 10, rlkit's kl_clamp
    default); kl_coef is the coefficient, Trinity-RFT's 0.001 when the file names a function without one."""
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": None,
                                           "algorithm.kl_penalty_fn": "low_var_kl",
                                           "algorithm.kl_penalty_fn_args": {"kl_coef": 0.05, "adaptive": False},
                                           "algorithm.kl_loss_fn": "k2"}), "t")
    assert (mapping["actor"]["kl_estimator"], mapping["actor"]["kl_ctl"]) == ("k3", 0.05)
    assert (mapping["actor"]["kl_loss_type"], mapping["actor"]["kl_loss_coef"]) == ("k2", 0.001)
    said = {f.key: f.fate for f in fates}
    assert "clamped" in said["algorithm.kl_penalty_fn"] and "0.001, Trinity-RFT's default" in \
        said["algorithm.kl_loss_fn"]
    assert said["algorithm.kl_penalty_fn_args.adaptive"].startswith("left out (")
    off, fates = _to_rlkit(_trinity(**{"algorithm.kl_loss_fn": "none"}), "t")
    assert "kl_loss_coef" not in off["actor"] and "kl_loss_type" not in off["actor"]
    assert {f.key: f.fate for f in fates}["algorithm.kl_loss_fn"].startswith("left out (none")


def test_the_kl_penalty_s_adaptive_controller_moves() -> None:
    """kl_penalty_fn_args adaptive with target_kl and horizon (Trinity-RFT's KLFn.update_kl_coef, the same update)
    becomes actor.kl_ctl_adaptive, kl_coef its starting coefficient; adaptive false, or kl_coef 0, leaves them out."""
    args = {"kl_coef": 0.05, "adaptive": True, "target_kl": 0.02, "horizon": 2000.0}
    mapping, fates = _to_rlkit(_trinity(**{**_PPO, "algorithm.kl_penalty_fn": "k3",
                                           "algorithm.kl_penalty_fn_args": args}), "t")
    assert mapping["actor"]["kl_ctl"] == 0.05
    assert mapping["actor"]["kl_ctl_adaptive"] == {"target_kl": 0.02, "horizon": 2000}
    said = {f.key: f.fate for f in fates}
    assert said["algorithm.kl_penalty_fn_args.adaptive"].startswith("moved to actor.kl_ctl_adaptive (")
    assert said["algorithm.kl_penalty_fn_args.horizon"] == "moved to actor.kl_ctl_adaptive.horizon"
    for change, why in (({"adaptive": False}, "adaptive is off"), ({"kl_coef": 0}, "kl_coef is 0")):
        mapping, fates = _to_rlkit(_trinity(**{**_PPO, "algorithm.kl_penalty_fn": "k3",
                                               "algorithm.kl_penalty_fn_args": {**args, **change}}), "t")
        assert "kl_ctl_adaptive" not in mapping["actor"], change
        said = {f.key: f.fate for f in fates}
        assert said["algorithm.kl_penalty_fn_args.target_kl"].startswith(f"left out ({why}"), said


@pytest.mark.parametrize("changes, says", [
    ({"algorithm.kl_loss_fn": "abs"}, r"kl_loss_fn 'abs' .* not one of rlkit's estimators"),
    ({**_PPO, "algorithm.kl_penalty_fn": "corrected_k3"}, r"kl_penalty_fn 'corrected_k3' .* pi/pi_old"),
    ({"algorithm.kl_loss_fn": "k3", "algorithm.kl_loss_fn_args": {"adaptive": True, "target_kl": 0.1,
                                                                  "horizon": 100}}, r"only the KL reward penalty's"),
    ({**_PPO, "algorithm.kl_penalty_fn": "k1", "algorithm.kl_penalty_fn_args": {"adaptive": True, "horizon": 100}},
     r"target_kl None .* adaptive needs a target KL > 0"),
    ({**_PPO, "algorithm.kl_penalty_fn": "k1", "algorithm.kl_penalty_fn_args": {"adaptive": True,
                                                                                 "target_kl": 0.1, "horizon": 2.5}},
     r"horizon 2.5 .* a whole number >= 1"),
    ({"algorithm.kl_loss_fn": "k3", "algorithm.kl_loss_fn_args": {"kl_coef": "lots"}}, r"kl_coef 'lots'"),
    ({"algorithm.kl_loss_fn": ["k3"]}, r"kl_loss_fn '\['k3'\]'"),  # hostile shapes are named, not a TypeError
    ({"algorithm.algorithm_type": ["grpo"]}, r"algorithm_type '\['grpo'\]' .* has no rlkit job type"),
])
def test_kl_functions_rlkit_lacks_are_refused(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _to_rlkit(_trinity(**changes), "t")


@pytest.mark.parametrize("algorithm", ["grpo", "opmd", "mix"])
def test_the_kl_penalty_of_an_algorithm_whose_advantages_trinity_computes_outside_its_trainer_is_left_out(
        algorithm: str) -> None:
    """Trinity-RFT's trainer builds kl_penalty_fn only for algorithm types with compute_advantage_in_trainer (ppo
    of rlkit's); its grpo, opmd and mix never read it: moved, rlkit would add a penalty the run never had (and load a
    reference model for it). The KL loss (kl_loss_fn) is theirs and moves."""
    expert = {"buffer.trainer_input.auxiliary_buffers.sft_dataset": {"path": "/tmp/e.jsonl"}} \
        if algorithm == "mix" else {}
    mapping, fates = _to_rlkit(_trinity(**expert, **{"algorithm.algorithm_type": algorithm,
                                                     "algorithm.kl_penalty_fn": "k3",
                                                     "algorithm.kl_penalty_fn_args": {
                                                         "kl_coef": 0.05, "adaptive": True, "target_kl": 0.1,
                                                         "horizon": 100},
                                                     "algorithm.kl_loss_fn": "k2"}), "t")
    assert "kl_ctl" not in mapping["actor"] and "kl_ctl_adaptive" not in mapping["actor"]
    assert mapping["actor"]["kl_loss_type"] == "k2"
    said = {f.key: f.fate for f in fates}
    for key in ("algorithm.kl_penalty_fn", "algorithm.kl_penalty_fn_args.kl_coef",
                "algorithm.kl_penalty_fn_args.adaptive"):
        assert said[key].startswith(f"left out (Trinity-RFT's {algorithm} computes its advantages outside the "
                                    "trainer"), said[key]


@pytest.mark.parametrize("name, fn", [("accuracy_reward", "math"), ("math_boxed_reward", "math"),
                                      ("countdown_reward", None), ("math_reward", None), ("my_reward", None),
                                      (["accuracy_reward"], None)])
def test_reward_function_names_map_to_a_builtin_or_are_named_as_left_out(name: Any, fn: str | None) -> None:
    mapping, fates = _to_rlkit(_trinity(**{"buffer.explorer_input.default_reward_fn_type": name,
                                           "buffer.explorer_input.taskset.format.response_key": "solution"}), "t")
    said = {f.key: f.fate for f in fates}["buffer.explorer_input.default_reward_fn_type"]
    assert mapping["reward"].get("fn") == fn and mapping["reward"]["answer_key"] == "solution"
    assert said.startswith("moved to reward.fn as math") if fn else (said.startswith("left out (") and len(said) > 30)
    # the taskset's own reward function wins over the explorer input's, as in Trinity-RFT
    mapping, fates = _to_rlkit(_trinity(**{"buffer.explorer_input.taskset.default_reward_fn_type": "accuracy_reward",
                                           "buffer.explorer_input.default_reward_fn_type": name}), "t")
    assert mapping["reward"]["fn"] == "math"
    assert "taskset.default_reward_fn_type wins" in {f.key: f.fate for f in fates}[
        "buffer.explorer_input.default_reward_fn_type"]


def test_expert_data_ratio_is_the_expert_rows_per_step() -> None:
    """Trinity-RFT's mix sample strategy reads ceil(ratio x batch_size x repeat_times) expert experiences a step:
    16 prompts x 8 samples x 0.3 -> 39 rows, rlkit's expert_dataset.batch_size (mix.mu is the loss weight)."""
    mix = {"algorithm.algorithm_type": "mix", "algorithm.advantage_fn_args": None,
           "buffer.trainer_input.auxiliary_buffers.sft_dataset": {"path": "/tmp/sft.jsonl"},
           "algorithm.sample_strategy_args": {"expert_data_ratio": 0.3}}
    mapping, fates = _to_rlkit(_trinity(**mix), "t")
    assert mapping["expert_dataset"] == {"path": "/tmp/sft.jsonl", "batch_size": 39} and "mix" not in mapping
    mapping, _ = _to_rlkit(_trinity(**mix, **{"buffer.train_batch_size": 10}), "t")
    assert mapping["expert_dataset"]["batch_size"] == 3
    _, fates = _to_rlkit(_trinity(**{"algorithm.sample_strategy_args": {"expert_data_ratio": 0.3}}), "t")
    assert "no expert data" in {f.key: f.fate for f in fates}["algorithm.sample_strategy_args.expert_data_ratio"]
    with pytest.raises(ConfigError, match=r"expert_data_ratio 1.5 .* not a fraction"):
        _to_rlkit(_trinity(**{**mix, "algorithm.sample_strategy_args": {"expert_data_ratio": 1.5}}), "t")


def test_references_are_resolved_as_trinity_resolves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """${key} and ${oc.env:VAR,default} are resolved before the keys move (an environment variable's text typed as
    its value); the header names the reference each value came from."""
    monkeypatch.setenv("RLKIT_TEST_MODEL", "/models/qwen")
    monkeypatch.setenv("RLKIT_TEST_ENGINES", "2")
    mapping, fates = _to_rlkit(_trinity(**{"model.model_path": "${oc.env:RLKIT_TEST_MODEL}",
                                           "model.critic_model_path": "${model.model_path}",
                                           "algorithm.algorithm_type": "ppo", "algorithm.advantage_fn_args": None,
                                           "explorer.rollout_model.engine_num": "${oc.env:RLKIT_TEST_ENGINES}",
                                           "checkpoint_root_dir": "${oc.env:RLKIT_TEST_UNSET_ROOT,/tmp/ckpt}"}), "t")
    assert (mapping["actor"]["path"], mapping["critic"]["path"]) == ("/models/qwen", "/models/qwen")
    assert mapping["allocation_mode"] == "vllm:d2t2+fsdp:d4" and mapping["cluster"]["fileroot"] == "/tmp/ckpt"
    assert "(resolved from ${model.model_path})" in {f.key: f.fate for f in fates}["model.critic_model_path"]


def test_references_that_cannot_be_resolved_are_each_named() -> None:
    with pytest.raises(ConfigError) as refused:
        _to_rlkit(_trinity(**{"model.model_path": "${oc.env:RLKIT_TEST_SURELY_UNSET}",
                              "buffer.explorer_input.taskset.path": "${buffer.no_such_key}"}), "t")
    said = str(refused.value) + str(refused.value.hint)
    assert "model.model_path: '${oc.env:RLKIT_TEST_SURELY_UNSET}'" in said
    assert "buffer.explorer_input.taskset.path: '${buffer.no_such_key}'" in said


def test_a_trinity_migration_prints_no_empty_areal_heading(tmp_path: Path) -> None:
    """The AReaL heading is written only over AReaL keys: a Trinity-RFT file's mapping has none."""
    from rlkit.config.areal.migrate import migrate

    with as_rlkit_file(_write(tmp_path, _trinity()), REGISTRY.trinity_algorithms) as (source, _):
        text, _ = migrate(source, SITE, REGISTRY)
    assert "AReaL keys" not in text and text.startswith("# rlkit config written by `rlkit migrate` from")


def test_the_policy_loss_aggregation_moves_to_actor_loss_agg_mode() -> None:
    """policy_loss_fn_args.loss_agg_mode has verl's names, which are rlkit's (a value outside them is refused at
    render, by actor.loss_agg_mode's choices)."""
    mapping, fates = _to_rlkit(_trinity(**{"algorithm.policy_loss_fn_args": {"loss_agg_mode": "seq-mean-token-mean"}}),
                               "t")
    assert mapping["actor"]["loss_agg_mode"] == "seq-mean-token-mean"
    assert "actor.loss_agg_mode" in {f.key: f.fate for f in fates}["algorithm.policy_loss_fn_args.loss_agg_mode"]


def test_entropy_loss_functions_become_the_entropy_bonus() -> None:
    """Trinity-RFT's default (older: basic) and mix entropy loss functions subtract entropy_coef x the token-mean
    entropy: actor.entropy_coeff (mix's over the RL rows, as rlkit's); none is off; an unknown function or a
    negative coefficient is refused naming it."""
    for fn in ("default", "basic", "mix"):
        mapping, fates = _to_rlkit(_trinity(**{"algorithm.entropy_loss_fn": fn,
                                               "algorithm.entropy_loss_fn_args": {"entropy_coef": 0.01}}), "t")
        assert mapping["actor"]["entropy_coeff"] == 0.01, fn
        said = {f.key: f.fate for f in fates}
        assert said["algorithm.entropy_loss_fn_args.entropy_coef"].startswith("moved to actor.entropy_coeff")
        assert ("RL rows" in said["algorithm.entropy_loss_fn"]) == (fn == "mix")
    only_args, _ = _to_rlkit(_trinity(**{"algorithm.entropy_loss_fn": None,
                                         "algorithm.entropy_loss_fn_args": {"entropy_coef": 0.02}}), "t")
    assert only_args["actor"]["entropy_coeff"] == 0.02  # the algorithm's default function reads it
    off, fates = _to_rlkit(_trinity(**{"algorithm.entropy_loss_fn": "none",
                                       "algorithm.entropy_loss_fn_args": {"entropy_coef": 0.5}}), "t")
    assert "entropy_coeff" not in off["actor"]
    assert {f.key: f.fate for f in fates}["algorithm.entropy_loss_fn_args.entropy_coef"].startswith("left out (")
    for bad, says in ((dict(entropy_loss_fn="max_entropy"), "algorithm.entropy_loss_fn 'max_entropy' (t) is not one"),
                      (dict(entropy_loss_fn_args={"entropy_coef": -1}),
                       "algorithm.entropy_loss_fn_args.entropy_coef -1 (t) is not a number >= 0")):
        with pytest.raises(ConfigError) as info:
            _to_rlkit(_trinity(**{f"algorithm.{k}": v for k, v in bad.items()}), "t")
        assert says in str(info.value)


def test_a_migration_writes_no_knob_its_own_check_refuses_as_ignored(tmp_path: Path) -> None:
    """A mix weight without expert rows, and a KL function with kl_coef 0, are left out (named in the header):
    written, rlkit would refuse them as ignored (rlkit.checks.conditional_knobs), so the migrated file renders."""
    from rlkit.config.areal.migrate import migrate

    data = _trinity(**{"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": None,
                       "algorithm.policy_loss_fn_args": {"mu": 0.3}, "algorithm.kl_loss_fn": "k2",
                       "algorithm.kl_loss_fn_args": {"kl_coef": 0.0}})
    with as_rlkit_file(_write(tmp_path, data), REGISTRY.trinity_algorithms) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    config = prepare(clean, [], dry_run=True).config
    assert (config.mix.mu, config.actor.kl_loss_type, config.actor.kl_loss_coef) == (0.1, "k3", 0.0)  # the defaults
    assert "#   algorithm.policy_loss_fn_args.mu: 0.3  -> left out (no expert data" in header
    assert "#   algorithm.kl_loss_fn: k2  -> left out (algorithm.kl_loss_fn_args.kl_coef is 0" in header


def _migrated_actor(tmp_path: Path, data: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The migrated file's actor section as rlkit loads it, and each Trinity-RFT key's fate."""
    from rlkit.config.areal.migrate import migrate

    with as_rlkit_file(_write(tmp_path, data), REGISTRY.trinity_algorithms) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    _, fates = _to_rlkit(data, "trinity.yaml")
    return prepare(clean, [], dry_run=True).config.actor, {f.key: f.fate for f in fates}


@pytest.mark.parametrize(("adapter", "expected"), [
    ({}, (32, 32, ["all-linear"])),  # Trinity-RFT's defaults
    ({"name": "a", "lora_rank": 16, "lora_alpha": 8, "target_modules": "q_proj,v_proj"}, (16, 8, ["q_proj", "v_proj"])),
    ({"lora_rank": 8, "target_modules": ["q_proj", "k_proj"], "lora_dtype": "bfloat16"}, (8, 32, ["q_proj", "k_proj"])),
])
def test_trinity_s_lora_adapter_becomes_rlkit_s(tmp_path: Path, adapter: dict[str, Any],
                                                 expected: tuple[int, int, list[str]]) -> None:
    """model.lora_configs' one adapter is actor.use_lora with its rank, alpha and modules: left out, as it was,
    the migrated file trained the whole model (another run, far more memory) without a word beyond the header."""
    actor, fates = _migrated_actor(tmp_path, _trinity(**{"model.lora_configs": [adapter]}))
    assert actor.use_lora and (actor.lora_rank, actor.lora_alpha, actor.target_modules) == expected
    assert fates["model.lora_configs"].startswith("moved to actor.target_modules (and actor.use_lora: true")
    # its sync_method nccl: rlkit sends an adapter by disk only (refused with xccl), so the push goes by disk
    assert actor.weight_update_mode == "disk" and "as disk (LoRA" in fates["synchronizer.sync_method"]
    if "lora_dtype" in adapter:
        assert "lora_dtype bfloat16 left out" in fates["model.lora_configs"]
    plain, fates = _migrated_actor(tmp_path, _trinity(**{"model.lora_configs": []}))
    assert not plain.use_lora and fates["model.lora_configs"].startswith("left out (no adapter")


@pytest.mark.parametrize(("changes", "says"), [
    ({"model.lora_configs": [{}, {}]}, "2 adapters: rlkit trains one"),
    ({"model.lora_configs": [{"path": "/ckpt/adapter"}]}, "starts from a trained one"),
    ({"model.lora_configs": {"lora_rank": 8}}, "a mapping, where Trinity-RFT takes a list"),
    ({"model.lora_configs": ["x"]}, "its adapter is a str"),
    ({"model.lora_configs": [{"target_modules": 3}]}, "target_modules is neither"),
    ({"model.tinker": {"enable": True, "rank": 8}}, "Tinker trains through a remote service"),
])
def test_lora_settings_rlkit_cannot_take_are_refused(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _to_rlkit(_trinity(**changes), "trinity.yaml")


def test_tinker_off_is_left_out() -> None:
    _, fates = _to_rlkit(_trinity(**{"model.tinker": {"enable": False, "rank": 8}}), "trinity.yaml")
    assert {f.key: f.fate for f in fates}["model.tinker.rank"] == "left out (Tinker is off)"


def test_eval_tasksets_are_evaluated_when_and_as_trinity_rft_would() -> None:
    """Trinity-RFT's ExplorerConfig evaluates the eval tasksets every eval_interval (100) steps and at startup
    (eval_on_startup true) unless told otherwise: a file giving tasksets but neither key became valid_dataset.path
    with no evaluator, which rlkit's own check refuses ("the evaluator never runs")."""
    out, fates = _to_rlkit(_trinity(**{"explorer.eval_interval": None}), "t")
    assert out["evaluator"] == {"freq_steps": 100, "eval_on_startup": True}
    assert {f.key: f.fate for f in fates}["explorer.eval_interval"] == \
        "moved to evaluator.freq_steps as 100, Trinity-RFT's default"
    out, _ = _to_rlkit(_trinity(**{"explorer.eval_on_startup": False}), "t")
    assert out["evaluator"] == {"freq_steps": 10, "eval_on_startup": False}
    out, _ = _to_rlkit(_trinity(**{"buffer.explorer_input.eval_tasksets": None, "explorer.eval_interval": None}), "t")
    assert "evaluator" not in out

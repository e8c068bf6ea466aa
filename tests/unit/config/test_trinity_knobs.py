"""`rlkit migrate` of Trinity-RFT's sampling, optimizer, clip and prompt knobs (rlkit.config.trinity_knobs): they fell
to "left out (rlkit has no such key)", so a file with top_p 0.9, AdamW betas (0.9, 0.999) or DAPO's clip-higher
migrated into a run that learned another way under the same name. Each is now moved where rlkit has the meaning,
refused naming why where it has not (unless Trinity-RFT's default), and infrastructure keys say why they are left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import ConfigError
from tests.unit.config.test_trinity_migrate import _to_rlkit, _trinity, migrated_config

GRPO = {"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn_args": None}
TASKSET = "buffer.explorer_input.taskset"


def _migrated(tmp_path: Path, **changes: Any) -> tuple[Any, dict[str, str]]:
    """The migrated file as rlkit loads it, and each Trinity-RFT key's fate."""
    return migrated_config(tmp_path, _trinity(**{**GRPO, **changes}))


def test_optimizer_knobs_move(tmp_path: Path) -> None:
    config, fates = _migrated(tmp_path, **{"algorithm.optimizer": {
        "lr": 1e-6, "lr_scheduler_type": "cosine", "betas": [0.9, 0.999], "weight_decay": 0.01,
        "lr_warmup_steps_ratio": 0.1, "min_lr_ratio": 0.2, "optimizer_type": "adamw"}})
    opt = config.actor.optimizer
    assert (opt.beta1, opt.beta2, opt.weight_decay) == (0.9, 0.999, 0.01)
    assert (opt.warmup_steps_proportion, opt.min_lr_ratio, opt.lr_scheduler_type) == (0.1, 0.2, "cosine")
    assert fates["algorithm.optimizer.optimizer_type"].startswith("left out (rlkit's adam is AdamW")
    # warmup_style is lr_scheduler_type's older name; lr_warmup_steps (a count) wins over the ratio, as a fraction
    config, fates = _migrated(tmp_path, **{"algorithm.optimizer": {"lr": 1e-6, "warmup_style": "cosine",
                                                                   "lr_warmup_steps": 10, "lr_warmup_steps_ratio": 0.5},
                                           "buffer.total_steps": 40})
    opt = config.actor.optimizer
    assert (opt.lr_scheduler_type, opt.warmup_steps_proportion) == ("cosine", 0.25)
    assert "lr_warmup_steps is set and wins" in fates["algorithm.optimizer.lr_warmup_steps_ratio"]


@pytest.mark.parametrize(("args", "expected"), [
    ({"clip_range_low": 0.2, "clip_range_high": 0.28}, (0.2, 0.28)),  # DAPO's clip-higher
    ({"clip_range": 0.3}, (0.3, None)),  # both sides
    ({"clip_range": 0.3, "clip_range_low": 0.1}, (0.1, 0.3)),  # clip_range is the side not given
])
def test_ppo_clip_ranges_move(tmp_path: Path, args: dict[str, float], expected: tuple[float, float | None]) -> None:
    config, _ = _migrated(tmp_path, **{"algorithm.policy_loss_fn_args": args})
    assert (config.actor.eps_clip, config.actor.eps_clip_higher) == expected


def test_sampling_and_prompt_knobs_move(tmp_path: Path) -> None:
    config, fates = _migrated(tmp_path, **{f"{TASKSET}.rollout_args": {"temperature": 0.8, "top_p": 0.9, "top_k": 50,
                                                                         "max_tokens": 48, "n": 8},
                                           "model.max_response_tokens": None, "model.max_prompt_tokens": 512})
    g = config.gconfig
    assert (g.temperature, g.top_p, g.top_k, g.max_new_tokens, g.n_samples) == (0.8, 0.9, 50, 48, 8)
    assert config.train_dataset.max_length == 512
    assert "the same as algorithm.repeat_times" in fates[f"{TASKSET}.rollout_args.n"]
    config, fates = _migrated(tmp_path, **{"model.max_prompt_tokens": 512, "model.enable_prompt_truncation": False,
                                           f"{TASKSET}.format": {"prompt_type": "messages", "messages_key": "chat"}})
    assert (config.train_dataset.max_length, config.train_dataset.prompt_key) == (None, "chat")


@pytest.mark.parametrize(("tools_key", "ours", "fate"), [
    ("functions", "functions", "moved to train_dataset.tools_key (the row's tools, given to the chat template)"),
    ("tools", "tools", "moved to train_dataset.tools_key (the row's tools, given to the chat template)"),
    (None, "", "moved to train_dataset.tools_key (None: no tools column read)"),
])
def test_the_taskset_s_tools_column_moves(tmp_path: Path, tools_key: str | None, ours: str, fate: str) -> None:
    """Trinity-RFT's taskset format.tools_key (default 'tools') names the rows' tools: rlkit's prompt rows read
    them through train_dataset.tools_key, where it once refused the key even at Trinity-RFT's default."""
    config, fates = _migrated(tmp_path, **{f"{TASKSET}.format": {"tools_key": tools_key}})
    assert config.train_dataset.tools_key == ours and fates[f"{TASKSET}.format.tools_key"] == fate
    with pytest.raises(ConfigError, match=r"format.tools_key \['tools'\] \(t\) is not a column name"):
        _to_rlkit(_trinity(**{f"{TASKSET}.format.tools_key": ["tools"]}), "t")


def test_trinity_s_defaults_are_written_where_the_file_leaves_them(tmp_path: Path) -> None:
    """rlkit's optimizer defaults (lr 2e-5, weight_decay 0.05, betas (0.9, 0.95), warmup 0.001, eps 1e-5) and its
    shuffled rows are not Trinity-RFT's: a file that leaves them unset trains with Trinity-RFT's."""
    config, fates = _migrated(tmp_path, **{"algorithm.optimizer": {"lr_scheduler_type": "constant"},
                                           "model.temperature": 0.7, "model.top_p": 0.8,
                                           f"{TASKSET}.rollout_args": {"top_p": 0.9},
                                           "algorithm.loss_agg_mode": "seq-mean-token-sum"})
    opt = config.actor.optimizer
    assert (opt.lr, opt.weight_decay, opt.beta1, opt.beta2, opt.eps) == (1e-6, 0.01, 0.9, 0.999, 1e-8)
    assert (opt.warmup_steps_proportion, config.train_dataset.shuffle) == (0.0, False)
    assert fates["algorithm.optimizer.lr"] == "moved to actor.optimizer.lr as 1e-06, Trinity-RFT's default"
    # the model's sampling unless the taskset's rollout_args say; the eval set once per prompt (repeat_times 1)
    assert (config.gconfig.temperature, config.gconfig.top_p, config.eval_gconfig.n_samples) == (0.7, 0.9, 1)
    assert config.actor.loss_agg_mode == "seq-mean-token-sum"
    config, _ = _migrated(tmp_path, **{f"{TASKSET}.data_selector": {"selector_type": "shuffle"}})
    assert config.train_dataset.shuffle


@pytest.mark.parametrize(("changes", "says"), [
    ({"model.repetition_penalty": 1.2}, "model.repetition_penalty (t): rlkit's sampling has no repetition penalty"),
    ({"model.rope_scaling": {"type": "yarn", "factor": 4}}, "model.rope_scaling (t): rlkit loads the model as"),
    ({"model.custom_chat_template": "{{ x }}"}, "model.custom_chat_template (t): rlkit renders prompts with"),
    ({f"{TASKSET}.format.system_prompt": "Think first."}, "format.system_prompt (t): rlkit's RL prompts are"),
    ({f"{TASKSET}.subset_name": "main"}, "subset_name (t): rlkit reads a dataset's files"),
    ({"explorer.rollout_model.enable_thinking": True}, "enable_thinking (t): rlkit renders prompts"),
    ({"model.enable_thinking": False}, "model.enable_thinking (t): rlkit renders prompts"),
    ({"algorithm.rollout_correction": {"rollout_is": "token"}}, "rollout importance-sampling correction"),
    ({f"{TASKSET}.data_selector": {"selector_type": "difficulty_based"}}, "rlkit reads the rows shuffled or in"),
    ({"stages": [{"stage_name": "warmup"}]}, "stages (t): a staged run is read stage by stage"),
    ({"data_processor": {"task_pipeline": {"num_process": 4}}}, "data_processor (t): its pipelines"),
    ({"buffer.train_batch_size": 64}, "buffer.train_batch_size 64 (t) is not batch_size x repeat_times"),
    ({f"{TASKSET}.rollout_args.n": 4}, "rollout_args.n 4 and algorithm.repeat_times 8 (t) disagree"),
    ({f"{TASKSET}.rollout_args.max_tokens": 32}, "max_tokens 32 and model.max_response_tokens 64 (t) disagree"),
    ({"algorithm.optimizer.lr_warmup_steps": 10}, "lr_warmup_steps 10 (t): rlkit's warmup is a fraction"),
    ({"algorithm.optimizer.optimizer_type": "sgd"}, "optimizer_type 'sgd' (t) is not one rlkit has"),
    ({"algorithm.optimizer.clip_grad": 0.5}, "clip_grad 0.5 and trainer.grad_clip 1.0 (t) disagree"),
    ({"algorithm.advantage_fn_args.std_threshold": 0.01}, "std_threshold (t): rlkit has no per-group std"),
    ({"buffer.trainer_input.experience_buffer.replay_buffer": {"enable": True}}, "rlkit trains each sample once"),
])
def test_knobs_that_change_learning_and_rlkit_lacks_are_refused(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _to_rlkit(_trinity(**changes), "t")
    assert says in str(info.value)


def test_defaults_and_infrastructure_are_left_out_saying_why() -> None:
    """Trinity-RFT's default of a knob rlkit lacks changes nothing; the guide's logging, Ray and storage keys are named
    with why, none with the bare "rlkit has no such key"."""
    guide = {"model.repetition_penalty": 1.0, "algorithm.rollout_correction": {},
             "ray_namespace": "ns", "ignore_validator_suggestions": True, "monitor.enable_ray_timeline": True,
             "log": {"level": "INFO"}, "service.data_juicer": {"port": 5005}, "explorer.runner_per_model": 8,
             "explorer.max_timeout": 900, "explorer.env_vars": {"A": "1"}, "explorer.over_rollout": {"ratio": 0.0},
             "explorer.rollout_model.seed": 42, "trainer.save_hf_checkpoint": "last",
             "trainer.trainer_strategy": "fsdp", f"{TASKSET}.storage_type": "file",
             f"{TASKSET}.workflow_args": {"k": 1}, "buffer.explorer_input.default_eval_workflow_type": "math_workflow",
             "model.external_model": {"enable": False}}
    _, fates = _to_rlkit(_trinity(**guide), "t")
    left = {f.key: f.fate for f in fates if f.fate.startswith("left out")}
    assert left["model.repetition_penalty"] == "left out (1.0: Trinity-RFT's default, nothing to carry)"
    assert "algorithm.rollout_correction" in left and "log.level" in left
    assert not [k for k, fate in left.items() if "rlkit has no such key" in fate]

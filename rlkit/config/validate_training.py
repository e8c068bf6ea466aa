"""Submit-time checks of the training fields (job type grpo): each mistake is one ConfigError naming the fix.

These run on the login node before anything is written or submitted, so a job never dies minutes later in the
queue for a typo: the dataset exists and has the prompt column, the reward function imports, the batch splits into
minibatches and trainer ranks, the model has a tokenizer, and every choice field holds one of its choices.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlkit.config.schema import ExperimentConfig
from rlkit.config.validate import check_dataset_file
from rlkit.errors import ConfigError

CHOICES = {
    "actor.dtype": ("bfloat16", "float16", "float32"),
    "actor.optimizer.type": ("adam", "sgd"),
    "actor.optimizer.lr_scheduler_type": ("constant", "linear", "cosine"),
    "actor.kl_estimator": ("k1", "k2", "k3"),
    "actor.importance_sampling_level": ("token", "sequence"),
    "actor.adv_norm.mean_level": ("batch", "group", "none"),
    "actor.adv_norm.std_level": ("batch", "group", "none"),
    "actor.weight_update_mode": ("disk",),
    "recover.mode": ("disabled", "auto", "fault", "resume"),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _get(config: ExperimentConfig, dotted: str) -> object:
    value: object = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _first_row(path: Path) -> dict[str, object] | None:
    """The first row of a .jsonl file (None for other formats: checked in the job)."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or files[0].suffix != ".jsonl":
        return None
    with open(files[0]) as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"train_dataset.path: the first line of {files[0]} is not JSON ({exc})",
                                      hint="write one JSON object per line") from None
                return row if isinstance(row, dict) else None
    raise ConfigError(f"train_dataset.path: {files[0]} is empty", hint="give a file with at least one prompt")


def _check_tokenizer(config: ExperimentConfig) -> None:
    where = config.tokenizer_path or config.actor.path
    field = "tokenizer_path" if config.tokenizer_path else "actor.path"
    if where.startswith(("/", ".")) and not any((Path(where) / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{field}: '{where}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                          hint="copy the tokenizer files next to the model, or set tokenizer_path to a tokenizer "
                               "directory")


def validate_training(config: ExperimentConfig) -> None:
    """Raise ConfigError on the first problem in the grpo fields."""
    from rlkit.launch.allocation import parse_allocation
    from rlkit.rewards import resolve_reward_fn
    from rlkit.train.stats_logger import validate_stats_logger

    actor, g, ds = config.actor, config.gconfig, config.train_dataset
    for dotted, choices in CHOICES.items():
        value = _get(config, dotted)
        if value not in choices:
            raise ConfigError(f"{dotted} '{value}' is not one of: {', '.join(choices)}",
                              hint=f"e.g. {dotted}={choices[0]}")
    if not actor.path:
        raise ConfigError("actor.path is not set", hint="give the Hugging Face model directory to train")
    _check_tokenizer(config)
    if not ds.path:
        raise ConfigError("train_dataset.path is not set", hint="give a .jsonl or .parquet file of prompts")
    check_dataset_file("train_dataset.path", ds.path)
    row = _first_row(Path(ds.path))
    if row is not None and ds.prompt_key not in row:
        raise ConfigError(f"train_dataset.path: rows have no column '{ds.prompt_key}' (columns: {', '.join(row)})",
                          hint="set train_dataset.prompt_key to the prompt column")
    if row is not None and config.reward.fn in ("math", "exact_match") and config.reward.answer_key not in row:
        raise ConfigError(f"reward.fn {config.reward.fn} needs the answer column '{config.reward.answer_key}', "
                          f"which the dataset rows do not have (columns: {', '.join(row)})",
                          hint="set reward.answer_key to the reference-answer column")
    if config.valid_dataset.path:
        check_dataset_file("valid_dataset.path", config.valid_dataset.path)
    resolve_reward_fn(config.reward.fn, config.reward.answer_key)
    if config.reward.timeout <= 0:
        raise ConfigError(f"reward.timeout must be positive (got {config.reward.timeout})")
    if g.temperature <= 0:
        raise ConfigError(f"gconfig.temperature {g.temperature}: GRPO samples, so it must be > 0",
                          hint="e.g. gconfig.temperature=1.0")
    if actor.group_size != g.n_samples:
        raise ConfigError(f"actor.group_size ({actor.group_size}) differs from gconfig.n_samples ({g.n_samples}); "
                          "a GRPO group is the completions of one prompt",
                          hint=f"set actor.group_size={g.n_samples}")
    norm = actor.adv_norm
    if actor.group_size < 2 and "group" in (norm.mean_level, norm.std_level):
        raise ConfigError(f"actor.group_size {actor.group_size} with group normalisation: a group of one sample "
                          "has advantage 0 (and no std), so nothing would be learnt",
                          hint="set gconfig.n_samples and actor.group_size to 2 or more (e.g. 8), or use "
                               "actor.adv_norm.mean_level=batch")
    if norm.mean_leave1out and norm.mean_level == "group" and actor.group_size < 2:
        raise ConfigError("actor.adv_norm.mean_leave1out needs actor.group_size >= 2")
    if ds.batch_size < 1:
        raise ConfigError(f"train_dataset.batch_size must be at least 1 (got {ds.batch_size})")
    if actor.ppo_n_minibatches < 1:
        raise ConfigError(f"actor.ppo_n_minibatches must be at least 1 (got {actor.ppo_n_minibatches})")
    samples = ds.batch_size * actor.group_size
    if samples % actor.ppo_n_minibatches:
        raise ConfigError(f"a batch of {ds.batch_size} prompts x {actor.group_size} samples = {samples} sequences "
                          f"does not split into actor.ppo_n_minibatches={actor.ppo_n_minibatches} equal minibatches",
                          hint="choose train_dataset.batch_size and ppo_n_minibatches so that the number of "
                               "sequences is a multiple of ppo_n_minibatches")
    alloc = parse_allocation(config.allocation_mode)
    ranks = alloc.trainer.dp if alloc.trainer is not None else 1
    if samples < ranks * actor.ppo_n_minibatches:
        raise ConfigError(f"{samples} sequences per step are fewer than {ranks} trainer ranks x "
                          f"{actor.ppo_n_minibatches} minibatches: some ranks would have nothing to train on",
                          hint="raise train_dataset.batch_size or lower actor.ppo_n_minibatches")
    if actor.optimizer.lr <= 0:
        raise ConfigError(f"actor.optimizer.lr must be positive (got {actor.optimizer.lr})")
    if not 0 <= actor.optimizer.warmup_steps_proportion <= 1:
        raise ConfigError("actor.optimizer.warmup_steps_proportion must be between 0 and 1")
    if actor.eps_clip <= 0 or (actor.eps_clip_higher is not None and actor.eps_clip_higher <= 0):
        raise ConfigError("actor.eps_clip and actor.eps_clip_higher must be positive")
    if actor.c_clip is not None and actor.c_clip <= 1:
        raise ConfigError(f"actor.c_clip must be > 1 (got {actor.c_clip}); null turns dual clip off")
    if actor.kl_ctl < 0:
        raise ConfigError(f"actor.kl_ctl must be >= 0 (got {actor.kl_ctl})")
    if actor.overlong_reward_penalty:
        if not actor.overlong_tokens or actor.overlong_penalty_factor is None:
            raise ConfigError("actor.overlong_reward_penalty needs actor.overlong_tokens and "
                              "actor.overlong_penalty_factor",
                              hint="e.g. actor.overlong_tokens=256 actor.overlong_penalty_factor=1")
        if not 0 < actor.overlong_tokens <= g.max_new_tokens:
            raise ConfigError(f"actor.overlong_tokens {actor.overlong_tokens} must be in "
                              f"1..gconfig.max_new_tokens ({g.max_new_tokens})")
    if config.rollout.max_head_offpolicyness < 0:
        raise ConfigError("rollout.max_head_offpolicyness must be >= 0")
    if config.total_train_epochs < 1:
        raise ConfigError(f"total_train_epochs must be at least 1 (got {config.total_train_epochs})")
    if config.total_train_steps is not None and config.total_train_steps < 1:
        raise ConfigError(f"total_train_steps must be at least 1 or null (got {config.total_train_steps})")
    for name in ("freq_steps", "freq_epochs", "freq_secs"):
        value = getattr(config.saver, name)
        if value is not None and value < 1:
            raise ConfigError(f"saver.{name} must be at least 1 or null (got {value})")
    validate_stats_logger(config.stats_logger)
    _validate_recover(config)


def _validate_recover(config: ExperimentConfig) -> None:
    from rlkit.paths import TrialPaths
    from rlkit.train.recover import latest_valid, recover_root

    rec = config.recover
    for name in ("freq_steps", "freq_epochs", "freq_secs"):
        value = getattr(rec, name)
        if value is not None and value < 1:
            raise ConfigError(f"recover.{name} must be at least 1 or null (got {value})")
    if rec.retries < 0 or rec.keep_last < 1:
        raise ConfigError(f"recover.retries must be >= 0 and recover.keep_last >= 1 (got {rec.retries}, "
                          f"{rec.keep_last})")
    if not 60 <= rec.time_limit_warning <= 65535:
        raise ConfigError(f"recover.time_limit_warning must be 60..65535 seconds (got {rec.time_limit_warning}); "
                          "Slurm may deliver the warning up to 60 s early")
    if rec.mode == "resume":
        root = recover_root(TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name).root)
        if latest_valid(root, warn=False, checksums=False) is None:  # login node: manifests and sizes only
            raise ConfigError(f"recover.mode is resume but there is nothing to resume: {root} holds no valid "
                              "checkpoint", hint="start it fresh without recover.mode=resume, or set "
                                                 "recover.freq_steps/freq_secs so the next run leaves checkpoints")

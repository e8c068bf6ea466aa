"""Submit-time checks of the training fields (job type grpo): every mistake is collected, naming its fix.

These run on the login node before anything is written or submitted, so a job never dies minutes later in the
queue for a typo: the dataset exists and has the prompt column, the reward function imports, the batch splits into
minibatches and trainer ranks, the model has a tokenizer, and every choice field holds one of its choices.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems
from rlkit.config.schema import ExperimentConfig, StatsLoggerConfig, get_field
from rlkit.config.site_files import check_dataset_file, check_tokenizer_dir
from rlkit.errors import ConfigError

CHOICES = {
    "actor.dtype": ("bfloat16", "float16", "float32"),
    "actor.optimizer.type": ("adam", "sgd"),
    "actor.optimizer.lr_scheduler_type": ("constant", "linear", "cosine"),
    "actor.kl_estimator": ("k1", "k2", "k3"),
    "actor.importance_sampling_level": ("token", "sequence"),
    "actor.adv_norm.mean_level": ("batch", "group", "none"),
    "actor.adv_norm.std_level": ("batch", "group", "none"),
    "actor.weight_update_mode": ("disk", "xccl"),  # rlkit.weights.base.TRANSPORT_NAMES (a test keeps them equal)
    "recover.mode": ("disabled", "auto", "fault", "resume"),
}

SWANLAB_MODES = ("disabled", "local", "offline", "cloud")
WANDB_MODES = ("disabled", "offline", "online")


def _first_row(path: Path) -> dict[str, object] | None:
    """The first row of a .jsonl file (None for other formats: checked in the job)."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or files[0].suffix != ".jsonl":
        return None
    try:
        with open(files[0]) as f:
            line = next((line for line in f if line.strip()), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"train_dataset.path: {files[0]} cannot be read as text: "
                          f"{getattr(exc, 'strerror', None) or exc}", hint="give a .jsonl file you may read",
                          site=True) from None
    if line is None:
        raise ConfigError(f"train_dataset.path: {files[0]} is empty", hint="give a file with at least one prompt")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"train_dataset.path: the first line of {files[0]} is not JSON ({exc})",
                          hint="write one JSON object per line") from None
    return row if isinstance(row, dict) else None


def validate_training(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """Add every problem of the grpo fields to `problems`."""
    actor, g, ds = config.actor, config.gconfig, config.train_dataset
    for dotted, choices in CHOICES.items():
        value = get_field(config, dotted)
        if value not in choices:
            problems.add(f"{dotted} '{value}' is not one of: {', '.join(choices)}", hint=f"e.g. {dotted}={choices[0]}")
    _validate_weight_update(config, problems)
    if not actor.path:
        problems.add("actor.path is not set", hint="give the Hugging Face model directory to train")
    else:
        with problems.check():
            check_tokenizer_dir("tokenizer_path" if config.tokenizer_path else "actor.path",
                                config.tokenizer_path or actor.path)
    with problems.check():
        _validate_dataset(config)
    from rlkit.rewards import resolve_reward_fn  # imports the user's reward module: only for grpo

    with problems.check():
        resolve_reward_fn(config.reward.fn, config.reward.answer_key)
    if config.reward.timeout <= 0:
        problems.add(f"reward.timeout must be positive (got {config.reward.timeout})")
    if g.temperature <= 0:
        problems.add(f"gconfig.temperature {g.temperature}: GRPO samples, so it must be > 0",
                     hint="e.g. gconfig.temperature=1.0")
    _validate_batch(config, allocation, problems)
    _validate_actor(config, problems)
    if config.rollout.max_head_offpolicyness < 0:
        problems.add("rollout.max_head_offpolicyness must be >= 0")
    if config.rollout.consumer_batch_size not in (1, ds.batch_size):
        problems.add(f"rollout.consumer_batch_size ({config.rollout.consumer_batch_size}) differs from "
                     f"train_dataset.batch_size ({ds.batch_size}): rlkit trains on train_dataset.batch_size groups "
                     "per step", hint=f"remove rollout.consumer_batch_size or set it to {ds.batch_size}")
    if config.total_train_epochs < 1:
        problems.add(f"total_train_epochs must be at least 1 (got {config.total_train_epochs})")
    if config.total_train_steps is not None and config.total_train_steps < 1:
        problems.add(f"total_train_steps must be at least 1 or null (got {config.total_train_steps})")
    for name in ("freq_steps", "freq_epochs", "freq_secs"):
        value = getattr(config.saver, name)
        if value is not None and value < 1:
            problems.add(f"saver.{name} must be at least 1 or null (got {value})")
    with problems.check():
        validate_stats_logger(config.stats_logger)
    _validate_recover(config, problems)


def _validate_dataset(config: ExperimentConfig) -> None:
    ds = config.train_dataset
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


def _validate_batch(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    actor, g, ds = config.actor, config.gconfig, config.train_dataset
    if actor.group_size != g.n_samples:
        problems.add(f"actor.group_size ({actor.group_size}) differs from gconfig.n_samples ({g.n_samples}); "
                     "a GRPO group is the completions of one prompt", hint=f"set actor.group_size={g.n_samples}")
    norm = actor.adv_norm
    if actor.group_size < 2 and "group" in (norm.mean_level, norm.std_level):
        problems.add(f"actor.group_size {actor.group_size} with group normalisation: a group of one sample "
                     "has advantage 0 (and no std), so nothing would be learnt",
                     hint="set gconfig.n_samples and actor.group_size to 2 or more (e.g. 8), or use "
                          "actor.adv_norm.mean_level=batch")
    elif norm.mean_leave1out and norm.mean_level == "group" and actor.group_size < 2:
        problems.add("actor.adv_norm.mean_leave1out needs actor.group_size >= 2")
    if ds.batch_size < 1 or actor.ppo_n_minibatches < 1:
        problems.add(f"train_dataset.batch_size and actor.ppo_n_minibatches must be at least 1 (got "
                     f"{ds.batch_size}, {actor.ppo_n_minibatches})")
        return
    samples = ds.batch_size * actor.group_size
    if samples % actor.ppo_n_minibatches:
        problems.add(f"a batch of {ds.batch_size} prompts x {actor.group_size} samples = {samples} sequences "
                     f"does not split into actor.ppo_n_minibatches={actor.ppo_n_minibatches} equal minibatches",
                     hint="choose train_dataset.batch_size and ppo_n_minibatches so that the number of "
                          "sequences is a multiple of ppo_n_minibatches")
    ranks = allocation.trainer.dp if allocation is not None and allocation.trainer is not None else 1
    if samples < ranks * actor.ppo_n_minibatches:
        problems.add(f"{samples} sequences per step are fewer than {ranks} trainer ranks x "
                     f"{actor.ppo_n_minibatches} minibatches: some ranks would have nothing to train on",
                     hint="raise train_dataset.batch_size or lower actor.ppo_n_minibatches")


def _validate_actor(config: ExperimentConfig, problems: Problems) -> None:
    actor, g = config.actor, config.gconfig
    if actor.optimizer.lr <= 0:
        problems.add(f"actor.optimizer.lr must be positive (got {actor.optimizer.lr})")
    if not 0 <= actor.optimizer.warmup_steps_proportion <= 1:
        problems.add("actor.optimizer.warmup_steps_proportion must be between 0 and 1")
    if actor.eps_clip <= 0 or (actor.eps_clip_higher is not None and actor.eps_clip_higher <= 0):
        problems.add("actor.eps_clip and actor.eps_clip_higher must be positive")
    if actor.c_clip is not None and actor.c_clip <= 1:
        problems.add(f"actor.c_clip must be > 1 (got {actor.c_clip}); null turns dual clip off")
    if actor.logprob_mismatch_warn is not None and actor.logprob_mismatch_warn <= 0:
        problems.add(f"actor.logprob_mismatch_warn must be positive (got {actor.logprob_mismatch_warn}); null picks "
                     "one from the dtypes")
    if actor.kl_ctl < 0:
        problems.add(f"actor.kl_ctl must be >= 0 (got {actor.kl_ctl})")
    if actor.overlong_reward_penalty:
        if not actor.overlong_tokens or actor.overlong_penalty_factor is None:
            problems.add("actor.overlong_reward_penalty needs actor.overlong_tokens and actor.overlong_penalty_factor",
                         hint="e.g. actor.overlong_tokens=256 actor.overlong_penalty_factor=1")
        elif not 0 < actor.overlong_tokens <= g.max_new_tokens:
            problems.add(f"actor.overlong_tokens {actor.overlong_tokens} must be in "
                         f"1..gconfig.max_new_tokens ({g.max_new_tokens})")


def _validate_recover(config: ExperimentConfig, problems: Problems) -> None:
    from rlkit.paths import TrialPaths
    from rlkit.recover_layout import latest_valid, recover_root

    rec = config.recover
    for name in ("freq_steps", "freq_epochs", "freq_secs"):
        value = getattr(rec, name)
        if value is not None and value < 1:
            problems.add(f"recover.{name} must be at least 1 or null (got {value})")
    if rec.retries < 0 or rec.keep_last < 1:
        problems.add(f"recover.retries must be >= 0 and recover.keep_last >= 1 (got {rec.retries}, "
                     f"{rec.keep_last})")
    if not 60 <= rec.time_limit_warning <= 65535:
        problems.add(f"recover.time_limit_warning must be 60..65535 seconds (got {rec.time_limit_warning}); "
                     "Slurm may deliver the warning up to 60 s early")
    if rec.mode == "resume":
        root = recover_root(TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name).root)
        if latest_valid(root, warn=False, checksums=False) is None:  # login node: manifests and sizes only
            problems.add(f"recover.mode is resume but there is nothing to resume: {root} holds no valid "
                         "checkpoint", hint="start it fresh without recover.mode=resume, or set "
                                            "recover.freq_steps/freq_secs so the next run leaves checkpoints")


def validate_stats_logger(config: StatsLoggerConfig) -> None:
    """Raise ConfigError for an unknown SwanLab/W&B mode or an unusable TensorBoard path (called at submit time)."""
    for field, value, choices in (
        ("stats_logger.swanlab.mode", config.swanlab.mode, SWANLAB_MODES),
        ("stats_logger.wandb.mode", config.wandb.mode, WANDB_MODES),
    ):
        if value not in choices:
            raise ConfigError(
                f"{field}: invalid value {value!r}; choices: {', '.join(choices)}",
                hint=f"set {field}={choices[0]} to turn it off",
            )
    path = config.tensorboard.path
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ConfigError(
            f"stats_logger.tensorboard.path: invalid value {path!r}; expected a directory path or null (off)"
        )


# apptainer options that give a step its own network namespace: the servers' workers could no longer open a
# connection to trainer rank 0's address, which is how an xccl broadcast group forms (and NCCL also needs the host's
# InfiniBand devices). Flags as apptainer 1.x spells them (`--net`, `--network`, `--network-args`).
_OWN_NETWORK = ("--net", "--network", "--network-args")


def _validate_weight_update(config: ExperimentConfig, problems: Problems) -> None:
    """The weight push: sizes and timeouts in range; xccl only where the servers can reach the trainer."""
    actor = config.actor
    if actor.weight_chunked_mem_mb < 1:
        problems.add(f"actor.weight_chunked_mem_mb must be at least 1 (got {actor.weight_chunked_mem_mb})",
                     hint="e.g. actor.weight_chunked_mem_mb=1024")
    if not actor.weight_update_timeout > 0:
        problems.add(f"actor.weight_update_timeout must be a positive number of seconds "
                     f"(got {actor.weight_update_timeout})", hint="e.g. actor.weight_update_timeout=600")
    if actor.weight_update_mode != "xccl" or config.launcher.slurm.container_type != "apptainer":
        return
    try:
        words = shlex.split(config.launcher.slurm.apptainer_args)
    except ValueError:
        return  # reported by the launcher checks
    isolated = [w for w in words if w.split("=", 1)[0] in _OWN_NETWORK]
    if isolated:
        problems.add(f"actor.weight_update_mode xccl: launcher.slurm.apptainer_args has {' '.join(isolated)}, which "
                     "gives each step its own network namespace, so the servers' workers cannot connect to trainer "
                     "rank 0 to join the broadcast group",
                     hint="remove the network option from apptainer_args, or use actor.weight_update_mode=disk")

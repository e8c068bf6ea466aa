"""Submit-time checks every training job type shares (grpo, sft, rw, dpo, ...): the trained model and its tokenizer,
the optimizer, the length of the run, the savers, the metrics sinks and recovery. Every mistake is collected.
"""

from __future__ import annotations

from rlkit.checks.site_files import check_model_dir, check_tokenizer_dir
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import MicroBatchSpec, OptimizerConfig
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.config.schema.stats_logger import validate_stats_logger

DTYPES = ("bfloat16", "float16", "float32")
OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("constant", "linear", "cosine")
CHOICES = {
    "actor.dtype": DTYPES,
    "recover.mode": ("disabled", "auto", "fault", "resume"),
}



def validate_trainer(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the fields any trainer reads to `problems`."""
    for dotted, choices in CHOICES.items():
        value = get_field(config, dotted)
        if value not in choices:
            problems.add(f"{dotted} '{value}' is not one of: {', '.join(choices)}", hint=f"e.g. {dotted}={choices[0]}")
    actor = config.actor
    if not actor.path:
        problems.add("actor.path is not set", hint="give the Hugging Face model directory to train")
    else:
        with problems.check():
            check_model_dir("actor.path", actor.path)
        with problems.check():
            check_tokenizer_dir("tokenizer_path" if config.tokenizer_path else "actor.path",
                                config.tokenizer_path or actor.path)
    validate_optimizer("actor.optimizer", actor.optimizer, problems)
    validate_mb_spec("actor.mb_spec", actor.mb_spec, problems)
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


def validate_optimizer(field: str, optimizer: OptimizerConfig, problems: Problems) -> None:
    """An optimizer section (the actor's, the critic's): known type and schedule, a positive lr, a sane warmup."""
    if optimizer.type not in OPTIMIZERS:
        problems.add(f"{field}.type '{optimizer.type}' is not one of: {', '.join(OPTIMIZERS)}",
                     hint=f"e.g. {field}.type=adam")
    if optimizer.lr_scheduler_type not in LR_SCHEDULES:
        problems.add(f"{field}.lr_scheduler_type '{optimizer.lr_scheduler_type}' is not one of: "
                     f"{', '.join(LR_SCHEDULES)}", hint=f"e.g. {field}.lr_scheduler_type=constant")
    if not optimizer.lr > 0:
        problems.add(f"{field}.lr must be positive (got {optimizer.lr})", hint=f"e.g. {field}.lr=1e-5")
    if not 0 <= optimizer.warmup_steps_proportion <= 1:
        problems.add(f"{field}.warmup_steps_proportion must be between 0 and 1 (got "
                     f"{optimizer.warmup_steps_proportion})")


def validate_mb_spec(field: str, spec: MicroBatchSpec, problems: Problems) -> None:
    """A micro-batch spec: at least one micro-batch, a token budget of at least one token (or none)."""
    if spec.n_mbs < 1:
        problems.add(f"{field}.n_mbs must be at least 1 (got {spec.n_mbs})")
    if spec.max_tokens_per_mb is not None and spec.max_tokens_per_mb < 1:
        problems.add(f"{field}.max_tokens_per_mb must be at least 1 or null (got {spec.max_tokens_per_mb})")


def _validate_recover(config: ExperimentConfig, problems: Problems) -> None:
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.recover_layout import latest_valid, recover_root

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

"""Submit-time checks every training job type shares (grpo, sft, rw, dpo, ...): the trained model and its tokenizer,
the optimizer, the length of the run, the savers, the metrics sinks and recovery. Every mistake is collected.
"""

from __future__ import annotations

from rlkit.checks.site_files import check_model_dir, check_tokenizer_dir
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import PACKING_ALGORITHMS, OptimizerConfig
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.config.schema.stats_logger import validate_stats_logger

DTYPES = ("bfloat16", "float16", "float32")
OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("constant", "linear", "cosine")
CHOICES = {
    "actor.dtype": DTYPES,
    "recover.mode": ("disabled", "auto", "fault", "resume"),
    "actor.mb_spec.packing_algorithm": PACKING_ALGORITHMS,
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


def _validate_recover(config: ExperimentConfig, problems: Problems) -> None:
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.recover_layout import latest_valid, recover_root

    rec = config.recover
    if not 60 <= rec.time_limit_warning <= 65535:
        problems.add(f"recover.time_limit_warning must be 60..65535 seconds (got {rec.time_limit_warning}); "
                     "Slurm may deliver the warning up to 60 s early")
    if rec.mode == "resume":
        root = recover_root(TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name).root)
        if latest_valid(root, warn=False, checksums=False) is None:  # login node: manifests and sizes only
            problems.add(f"recover.mode is resume but there is nothing to resume: {root} holds no valid "
                         "checkpoint", hint="start it fresh without recover.mode=resume, or set "
                                            "recover.freq_steps/freq_secs so the next run leaves checkpoints")

"""The `stats_logger` section: where per-step metrics go besides the trial's metrics.jsonl, and the check of its
values (run at submit, and again by the trainer before it opens a sink)."""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f, _sub
from rlkit.errors import ConfigError

SWANLAB_MODES = ("disabled", "local", "offline", "cloud")
WANDB_MODES = ("disabled", "offline", "online")


@dataclass
class TensorBoardConfig:
    """TensorBoard event files."""

    path: str | None = _f(None, "Directory for event files; None: off.")


@dataclass
class SwanlabConfig:
    """SwanLab tracking."""

    project: str | None = _f(None, "Project; None: the experiment name.")
    name: str | None = _f(None, "Run name; None: the trial name.")
    mode: str = _f("disabled", "Choices: disabled, local, offline, cloud.")
    logdir: str | None = _f(None, "Local directory; None: <trial>/swanlab.")
    api_key: str | None = _f(None, "API key for cloud mode; None: SWANLAB_API_KEY.")


@dataclass
class WandBConfig:
    """Weights & Biases tracking."""

    mode: str = _f("disabled", "Choices: disabled, offline, online.")
    project: str | None = _f(None, "Project; None: the experiment name.")
    entity: str | None = _f(None, "Team or user.")
    name: str | None = _f(None, "Run name; None: the trial name.")


@dataclass
class StatsLoggerConfig:
    """Where per-step metrics go. A metrics.jsonl in the trial directory is always written."""

    tensorboard: TensorBoardConfig = _sub(TensorBoardConfig, "TensorBoard.")
    swanlab: SwanlabConfig = _sub(SwanlabConfig, "SwanLab.")
    wandb: WandBConfig = _sub(WandBConfig, "Weights & Biases.")


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

"""Per-step training metrics: always `<trial>/metrics.jsonl`, plus TensorBoard, SwanLab and W&B when configured.

Create one `StatsLogger` in the process that owns the metrics (rank 0). A sink that raises while logging is
disabled with one warning; the jsonl keeps going. torch, swanlab and wandb are imported only when their sink is on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import operator
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, SupportsFloat, SupportsIndex, cast

from rlkit import untrusted_json
from rlkit.config.schema.stats_logger import StatsLoggerConfig, validate_stats_logger
from rlkit.errors import ConfigError, StepError
from rlkit.trials.paths import TrialPaths

log = logging.getLogger(__name__)

# Our names -> swanlab 0.10.x `mode=` values ("cloud" is called "online" there).
_SWANLAB_MODE = {"local": "local", "offline": "offline", "cloud": "online"}
_RESERVED = ("step", "time")
_SECRET_KEYS = frozenset({"api_key", "apikey", "password", "secret", "token", "access_token"})


class MetricsSink(Protocol):
    """A destination for the finite scalars of each step."""

    name: str

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class StatsLogger:
    """Writes each step's metrics to `paths.metrics` and to every configured sink. Use as a context manager."""

    def __init__(
        self,
        config: StatsLoggerConfig,
        paths: TrialPaths,
        *,
        experiment: str,
        trial: str,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        validate_stats_logger(config)
        self.path = Path(paths.metrics)
        self._sinks: list[MetricsSink] = []
        self._disabled: list[MetricsSink] = []
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _end_partial_line(self._fd, self.path)
            safe_config = _redact(run_config) if run_config is not None else None
            if config.tensorboard.path is not None:
                self._sinks.append(_TensorBoardSink(config.tensorboard.path))
            if config.swanlab.mode != "disabled":
                self._sinks.append(_SwanlabSink(config, paths, experiment, trial, safe_config))
            if config.wandb.mode != "disabled":
                self._sinks.append(_WandbSink(config, paths, experiment, trial, safe_config))
        except BaseException:
            self.close(failed=True)
            raise

    @property
    def sinks(self) -> list[str]:
        """Names of the sinks still receiving metrics (the jsonl is not listed)."""
        return [s.name for s in self._sinks]

    def add_sink(self, sink: MetricsSink) -> None:
        """Send later steps to one more sink (it gets the same failure handling as the built-in ones)."""
        self._sinks.append(sink)

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Append `{"step", "time", **metrics}` to the jsonl (non-finite -> null) and pass finite values to sinks."""
        if self._closed:
            raise RuntimeError("StatsLogger.log() after close()")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        values = {_check_key(k): _number(k, v) for k, v in metrics.items()}
        finite = {k: v for k, v in values.items() if math.isfinite(v)}
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update({k: (v if k in finite else None) for k, v in values.items()})
        _write_all(self._fd, (json.dumps(record, allow_nan=False) + "\n").encode())
        os.fsync(self._fd)
        if not finite:
            return
        scalars = {k: float(v) for k, v in finite.items()}
        for sink in list(self._sinks):
            try:
                sink.log(step, scalars)
            except Exception as e:
                log.warning("stats logger: %s failed at step %d and is disabled from now on (metrics.jsonl "
                            "continues): %s: %s", sink.name, step, type(e).__name__, e)
                self._sinks.remove(sink)
                self._disabled.append(sink)

    def close(self, failed: bool = False) -> None:
        """Flush and finish every sink (a run that `failed` is marked so where the sink supports it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sink in self._sinks:
            try:
                sink.close(failed)
            except Exception as e:
                log.warning("stats logger: closing %s failed: %s: %s", sink.name, type(e).__name__, e)
        for sink in self._disabled:
            try:
                sink.close(True)
            except Exception:
                log.debug("stats logger: closing disabled sink %s failed", sink.name, exc_info=True)
        self._sinks, self._disabled = [], []
        os.close(self._fd)

    def __enter__(self) -> StatsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=exc_type is not None)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a partial last line (a job killed mid-write) is ignored."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = untrusted_json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif i != len(lines) - 1:  # the last element is the unterminated tail, if any
            log.warning("%s:%d: not a JSON object (a write cut off before a restart?); skipped", path, i + 1)
    return records


# --- helpers ------------------------------------------------------------------------------------------------------


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric names must be non-empty strings, got {key!r}")
    if key in _RESERVED:
        raise ValueError(f"metric name {key!r} is reserved (the jsonl has its own 'step' and 'time')")
    return key


def _number(key: str, value: object) -> float | int:
    """An int or float from a Python, numpy or 0-d torch number; TypeError for anything else."""
    if isinstance(value, float):
        return value
    if isinstance(value, (str, bytes)):
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}")
    try:
        return operator.index(cast(SupportsIndex, value))
    except TypeError:
        pass
    try:
        return float(cast(SupportsFloat, value))
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _end_partial_line(fd: int, path: Path) -> None:
    """If an earlier writer died mid-line, end that line so the next record starts on its own."""
    if path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
    if last != b"\n":
        _write_all(fd, b"\n")


def _redact(value: Any) -> Any:
    """A copy of a config with secret-looking values (api_key, token, ...) replaced, for sending to trackers."""
    if isinstance(value, Mapping):
        return {
            k: "<redacted>" if _is_secret(k) and v is not None else _redact(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(v) for v in value]
    return value


def _is_secret(key: object) -> bool:
    return isinstance(key, str) and (key.lower() in _SECRET_KEYS or key.lower().endswith("_api_key"))


def _scrub(message: str, secret: str | None) -> str:
    return message.replace(secret, "<redacted>") if secret else message


# --- sinks --------------------------------------------------------------------------------------------------------


class _TensorBoardSink:
    name = "tensorboard"

    def __init__(self, path: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(
                f"stats_logger.tensorboard.path is set but TensorBoard cannot be imported ({e})",
                hint="pip install tensorboard, or set stats_logger.tensorboard.path=null",
            ) from e
        self.writer = SummaryWriter(log_dir=path)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.flush()
        self.writer.close()


class _SwanlabSink:
    name = "swanlab"

    def __init__(
        self, config: StatsLoggerConfig, paths: TrialPaths, experiment: str, trial: str, run_config: Any
    ) -> None:
        cfg = config.swanlab
        try:
            import swanlab
        except ImportError as e:
            raise ConfigError(
                f"stats_logger.swanlab.mode={cfg.mode} but swanlab cannot be imported ({e})",
                hint="pip install swanlab, or set stats_logger.swanlab.mode=disabled",
            ) from e
        logdir = Path(cfg.logdir) if cfg.logdir is not None else paths.root / "swanlab"
        if cfg.mode == "local" and importlib.util.find_spec("swanboard") is None:
            log.warning("swanlab local mode: swanboard is not installed, so `swanlab watch` cannot show this run; "
                        "the run is still recorded under %s (pip install 'swanlab[dashboard]' to view it)", logdir)
        # interactive=False: never prompt for a login inside a batch job. The key goes in through Settings (used
        # for this run only, not saved to ~/.netrc); None falls back to SWANLAB_API_KEY or a saved login.
        settings: dict[str, Any] = {"interactive": False}
        if cfg.mode == "cloud" and cfg.api_key:
            settings["api_key"] = cfg.api_key
        try:
            self.run = swanlab.init(
                project=cfg.project or experiment,
                name=cfg.name or trial,
                mode=_SWANLAB_MODE[cfg.mode],
                log_dir=str(logdir),
                config=run_config,
                settings=swanlab.Settings(**settings),
            )
        except Exception as e:
            raise StepError(
                f"swanlab ({cfg.mode} mode) could not start the run: {_scrub(str(e), cfg.api_key)}"
                + (" (cloud mode needs stats_logger.swanlab.api_key, SWANLAB_API_KEY or `swanlab login`)"
                   if cfg.mode == "cloud" else "")
            ) from None

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self, failed: bool = False) -> None:
        if failed:
            self.run.finish(state="crashed", error="the training step failed")
        else:
            self.run.finish()


class _WandbSink:
    name = "wandb"

    def __init__(
        self, config: StatsLoggerConfig, paths: TrialPaths, experiment: str, trial: str, run_config: Any
    ) -> None:
        cfg = config.wandb
        try:
            import wandb
        except ImportError as e:
            raise ConfigError(
                f"stats_logger.wandb.mode={cfg.mode} but wandb cannot be imported ({e})",
                hint="pip install wandb, or set stats_logger.wandb.mode=disabled",
            ) from e
        paths.root.mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=cfg.project or experiment,
                entity=cfg.entity,
                name=cfg.name or trial,
                mode=cast(Any, cfg.mode),  # one of WANDB_MODES, checked at submit (validate_stats_logger)
                dir=str(paths.root),
                config=run_config,
            )
        except Exception as e:
            raise StepError(f"wandb ({cfg.mode} mode) could not start the run: {e}") from None

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)

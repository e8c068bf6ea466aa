"""StatsLogger: metrics.jsonl, TensorBoard, SwanLab and W&B files really written, failing sinks, config validation."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.schema.stats_logger import StatsLoggerConfig, validate_stats_logger
from rlkit.errors import ConfigError, StepError
from rlkit.trainer.stats_logger import StatsLogger, read_metrics
from rlkit.trials.paths import TrialPaths

STEPS: list[dict[str, float | int]] = [
    {"reward/mean": 0.5, "timing/train": 1.25, "loss/actor": -0.125, "seqs": 8},
    {"reward/mean": 1.5, "timing/train": float("nan"), "loss/actor": float("inf"), "seqs": 16},
    {"reward/mean": 2.5, "timing/train": 3.0, "loss/actor": -0.5, "seqs": 24},
]
RUN_CONFIG: dict[str, Any] = {"actor": {"lr": 1e-6}, "stats_logger": {"swanlab": {"api_key": "sk-do-not-upload"}}}


def finite_series(key: str) -> dict[int, float]:
    """{step: value} of one metric over STEPS, non-finite values left out (what the sinks should get)."""
    return {step: float(m[key]) for step, m in enumerate(STEPS) if math.isfinite(m[key])}


@pytest.fixture
def paths(tmp_path: Path) -> TrialPaths:
    return TrialPaths.of(tmp_path / "fileroot", "exp", "t1")


@pytest.fixture
def swanlab_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No network, no saved login, no prompts, no probes; returns a decoy log dir that must stay unused."""
    monkeypatch.chdir(tmp_path)  # swanlab reads ./.env and ./.swanlab/.netrc
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-home"))
    monkeypatch.setenv("SWANLAB_API_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("SWANLAB_PROBE_MONITOR", "false")
    monkeypatch.setenv("SWANLAB_PROBE_REQUIREMENTS", "false")
    decoy = tmp_path / "decoy-swanlog"
    # set (so monkeypatch restores them): local mode itself writes SWANLAB_LOG_DIR into os.environ
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(decoy))
    monkeypatch.setenv("SWANLAB_LOGDIR", str(decoy))
    for name in ("SWANLAB_API_KEY", "SWANLAB_WEBHOOK", "SWANLAB_MODE"):
        monkeypatch.delenv(name, raising=False)
    return decoy


def config(**overrides: Any) -> StatsLoggerConfig:
    cfg = StatsLoggerConfig()
    for dotted, value in overrides.items():
        section, field = dotted.split("__")
        setattr(getattr(cfg, section), field, value)
    return cfg


def log_all(logger: StatsLogger) -> None:
    for step, metrics in enumerate(STEPS):
        logger.log(step, metrics)


class Recorder:
    """A sink that keeps what it got; raises from the `fail_at`-th call on."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name = name
        self.fail_at = fail_at
        self.calls: list[tuple[int, dict[str, float]]] = []
        self.closed: list[bool] = []

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.fail_at is not None and len(self.calls) >= self.fail_at:
            raise ConnectionError("network is down")
        self.calls.append((step, dict(scalars)))

    def close(self, failed: bool = False) -> None:
        self.closed.append(failed)


# --- metrics.jsonl --------------------------------------------------------------------------------------------------


def test_jsonl_one_strict_json_line_per_step_and_reread(paths: TrialPaths) -> None:
    before = time.time()
    with StatsLogger(StatsLoggerConfig(), paths, experiment="exp", trial="t1") as logger:
        log_all(logger)
        assert len(read_metrics(paths.metrics)) == 3  # readable while the job runs: whole lines on disk
    after = time.time()

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not valid JSON")

    lines = paths.metrics.read_text().splitlines()
    assert len(lines) == 3
    parsed = [json.loads(line, parse_constant=no_constants) for line in lines]
    for step, (rec, metrics) in enumerate(zip(parsed, STEPS, strict=True)):
        assert rec["step"] == step
        assert before <= rec["time"] <= after
        assert rec.keys() == {"step", "time", *metrics}
        for key, value in metrics.items():
            assert rec[key] == (value if math.isfinite(value) else None)
    assert parsed[0]["seqs"] == 8 and isinstance(parsed[0]["seqs"], int)
    assert parsed[1]["timing/train"] is None and parsed[1]["loss/actor"] is None
    assert read_metrics(paths.metrics) == parsed


def test_truncated_last_line_is_ignored_and_a_restart_appends_on_a_new_line(paths: TrialPaths) -> None:
    with StatsLogger(StatsLoggerConfig(), paths, experiment="exp", trial="t1") as logger:
        log_all(logger)
    with paths.metrics.open("a") as f:
        f.write('{"step": 3, "time": 1.0, "reward/me')  # killed mid-write
    assert [r["step"] for r in read_metrics(paths.metrics)] == [0, 1, 2]

    with StatsLogger(StatsLoggerConfig(), paths, experiment="exp", trial="t1") as logger:  # the job restarts
        logger.log(3, {"reward/mean": 4.0})
    records = read_metrics(paths.metrics)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[-1]["reward/mean"] == 4.0


def test_bad_metrics_are_rejected_before_anything_is_written(paths: TrialPaths) -> None:
    with StatsLogger(StatsLoggerConfig(), paths, experiment="exp", trial="t1") as logger:
        with pytest.raises(ValueError, match="reserved"):
            logger.log(0, {"step": 1.0})
        with pytest.raises(TypeError, match="reward/mean"):
            logger.log(0, {"loss": 1.0, "reward/mean": "high"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="non-negative"):
            logger.log(-1, {"loss": 1.0})
    assert paths.metrics.read_text() == ""
    with pytest.raises(RuntimeError, match="after close"):
        logger.log(0, {"loss": 1.0})


# --- TensorBoard ----------------------------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_the_finite_scalars(tmp_path: Path, paths: TrialPaths) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    with StatsLogger(config(tensorboard__path=str(tb)), paths, experiment="exp", trial="t1") as logger:
        assert logger.sinks == ["tensorboard"]
        log_all(logger)
    assert list(tb.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(STEPS[0])
    for key in STEPS[0]:
        got = {ev.step: ev.value for ev in acc.Scalars(key)}
        assert got == pytest.approx(finite_series(key)), key


def test_tensorboard_failure_disables_it_and_jsonl_continues(
    tmp_path: Path, paths: TrialPaths, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    def broken(self: object, *args: object, **kwargs: object) -> None:
        raise OSError("disk quota exceeded")

    logger = StatsLogger(config(tensorboard__path=str(tmp_path / "tb")), paths, experiment="exp", trial="t1")
    monkeypatch.setattr(SummaryWriter, "add_scalar", broken)
    with caplog.at_level(logging.WARNING, logger="rlkit.trainer.stats_logger"), logger:
        log_all(logger)
        assert logger.sinks == []
    warnings = [r for r in caplog.records if "tensorboard" in r.getMessage()]
    assert len(warnings) == 1 and "disk quota exceeded" in warnings[0].getMessage()
    assert [r["step"] for r in read_metrics(paths.metrics)] == [0, 1, 2]


# --- failing sinks and closing --------------------------------------------------------------------------------------


def test_sink_that_raises_is_disabled_once_others_and_jsonl_continue(
    paths: TrialPaths, caplog: pytest.LogCaptureFixture
) -> None:
    flaky, good = Recorder("flaky", fail_at=1), Recorder("good")
    logger = StatsLogger(StatsLoggerConfig(), paths, experiment="exp", trial="t1")
    with caplog.at_level(logging.WARNING, logger="rlkit.trainer.stats_logger"), logger:
        logger.add_sink(flaky)
        logger.add_sink(good)
        log_all(logger)
        assert logger.sinks == ["good"]
    assert [step for step, _ in flaky.calls] == [0]
    assert [step for step, _ in good.calls] == [0, 1, 2]
    assert good.calls[1][1] == {"reward/mean": 1.5, "seqs": 16.0}  # non-finite values are not passed on
    assert [r.getMessage() for r in caplog.records].count(
        "stats logger: flaky failed at step 1 and is disabled from now on (metrics.jsonl continues): "
        "ConnectionError: network is down"
    ) == 1
    assert len(caplog.records) == 1
    assert good.closed == [False] and flaky.closed == [True]
    assert [r["step"] for r in read_metrics(paths.metrics)] == [0, 1, 2]


def test_context_manager_marks_the_run_failed_on_an_exception(paths: TrialPaths) -> None:
    sink = Recorder("rec")
    with pytest.raises(RuntimeError, match="boom"), StatsLogger(
        StatsLoggerConfig(), paths, experiment="exp", trial="t1"
    ) as logger:
        logger.add_sink(sink)
        logger.log(0, {"loss": 1.0})
        raise RuntimeError("boom")
    assert sink.closed == [True]
    logger.close()  # idempotent
    assert sink.closed == [True]


# --- SwanLab --------------------------------------------------------------------------------------------------------


def swanlab_records(run_dir: Path) -> list[Any]:
    """The protobuf records of a run's `run-<id>.swanlab` file (what `swanlab sync` uploads)."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader  # swanlab-internal: its own reader

    (run_file,) = run_dir.glob("run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    records = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        records.append(record)
    reader.close()
    return records


@pytest.mark.parametrize("mode", ["offline", "local"])
def test_swanlab_writes_its_run_under_the_logdir(
    mode: str, tmp_path: Path, paths: TrialPaths, swanlab_env: Path
) -> None:
    from swanlab.proto.swanlab.run.v1.run_pb2 import RUN_STATE_FINISHED

    logdir = None if mode == "offline" else str(tmp_path / "sl")
    cfg = config(swanlab__mode=mode, swanlab__logdir=logdir)
    with StatsLogger(cfg, paths, experiment="exp", trial="t1", run_config=RUN_CONFIG) as logger:
        assert logger.sinks == ["swanlab"]
        log_all(logger)

    root = paths.root / "swanlab" if logdir is None else Path(logdir)
    (run_dir,) = root.glob("run-*")
    assert not swanlab_env.exists()
    records = swanlab_records(run_dir)
    start = next(r.start for r in records if r.HasField("start"))
    assert (start.project, start.name) == ("exp", "t1")
    scalars: dict[str, dict[int, float]] = {}
    for r in records:
        if r.HasField("scalar"):
            scalars.setdefault(r.scalar.key, {})[r.scalar.step] = r.scalar.value.number
    assert scalars == {key: finite_series(key) for key in STEPS[0]}
    finish = [r.finish for r in records if r.HasField("finish")]
    assert len(finish) == 1 and finish[0].state == RUN_STATE_FINISHED

    saved = (run_dir / "files" / "config.yaml").read_text()
    assert "1.0e-06" in saved and "sk-do-not-upload" not in saved and "<redacted>" in saved

    if mode == "local":
        # The legacy dashboard layout: logs/<column id>/1000.log (column names live in swanboard's database).
        series = {}
        for log_file in (run_dir / "logs").glob("*/1000.log"):
            lines = [json.loads(line) for line in log_file.read_text().splitlines()]
            series[log_file.parent.name] = {line["index"]: line["data"] for line in lines}
        assert sorted(series.values(), key=str) == sorted((finite_series(k) for k in STEPS[0]), key=str)


def test_swanlab_cloud_without_a_key_fails_at_start_without_prompting(
    paths: TrialPaths, swanlab_env: Path
) -> None:
    with pytest.raises(StepError, match="no API key was provided, and interactive prompts are disabled"):
        StatsLogger(config(swanlab__mode="cloud"), paths, experiment="exp", trial="t1")
    assert not paths.metrics.read_text()


# --- W&B ------------------------------------------------------------------------------------------------------------


def test_wandb_not_installed_is_a_config_error(paths: TrialPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError) as err:
        StatsLogger(config(wandb__mode="offline"), paths, experiment="exp", trial="t1")
    assert "pip install wandb" in str(err.value) and "stats_logger.wandb.mode=disabled" in str(err.value)


def wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of an offline run's `run-<id>.wandb` file (what `wandb sync` uploads). wandb 0.31 has no
    Python reader of its own any more, so this reads its container format: a 7-byte file header, then LevelDB-log
    framed chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    import struct

    from wandb.proto.wandb_internal_pb2 import Record

    data, at, pending, records = run_file.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", data[:8]
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:  # a block's tail too short for a chunk header is padding
            at += 32768 - at % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at:at + 7])
        if kind == 0:
            break
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_writes_its_run_under_the_trial_with_finite_scalars_and_a_redacted_config(
    tmp_path: Path, paths: TrialPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real wandb run in offline mode: its files go under the trial directory, the history holds every finite
    scalar at its step, the secret in the run config is redacted and the caller's dict is untouched."""
    monkeypatch.chdir(tmp_path)
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config(wandb__mode="offline", wandb__entity="team")
    with StatsLogger(cfg, paths, experiment="exp", trial="t1", run_config=RUN_CONFIG) as logger:
        assert logger.sinks == ["wandb"]
        log_all(logger)

    (run_file,) = (paths.root / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's own service process writes the file: finish() can return before it has (seen under load: only the
    # header there, every record a moment later), so wait for the run's last record, the exit
    deadline = time.monotonic() + 60
    while True:
        try:
            records = wandb_records(run_file)
        except Exception:  # a chunk half written: read again
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, [r.WhichOneof("record_type") for r in records]
        time.sleep(0.2)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.entity, run.display_name) == ("exp", "team", "t1")
    series: dict[str, dict[int, float]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    series.setdefault(key, {})[items["_step"]] = value
    assert series == {key: finite_series(key) for key in STEPS[0]}
    assert b"sk-do-not-upload" not in run_file.read_bytes() and b"<redacted>" in run_file.read_bytes()
    assert RUN_CONFIG["stats_logger"]["swanlab"]["api_key"] == "sk-do-not-upload"
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 0


# --- validation -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "choices"),
    [
        ("swanlab.mode", "online", "disabled, local, offline, cloud"),
        ("wandb.mode", "cloud", "disabled, offline, online"),
    ],
)
def test_bad_mode_is_a_config_error_naming_field_value_and_choices(
    field: str, value: str, choices: str, paths: TrialPaths
) -> None:
    cfg = config(**{field.replace(".", "__"): value})
    with pytest.raises(ConfigError) as err:
        validate_stats_logger(cfg)
    message = str(err.value)
    assert f"stats_logger.{field}" in message and repr(value) in message and choices in message
    with pytest.raises(ConfigError):
        StatsLogger(cfg, paths, experiment="exp", trial="t1")
    assert not paths.metrics.exists()


def test_default_config_is_valid() -> None:
    validate_stats_logger(StatsLoggerConfig())

"""`rlkit status TRIAL` of a trainer-only job (rw, dpo, sft): epoch, last loss and last evaluation, read from the
progress.json shape of rlkit.trainer.offline_epochs and from metrics.jsonl."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

from rich.console import Console

from rlkit.cli.status import TrialDetail, TrialRow, _epochs, _last_eval, print_detail, trainer_status

PROGRESS = {"status": "running", "step": 12, "total_steps": 16, "epoch": 1, "total_epochs": 2,
            "eval": {"accuracy": 0.9375, "reward_margin": 1.25}}


def metrics_file(tmp_path: Path, *records: dict[str, object]) -> Path:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_epoch_and_last_training_loss(tmp_path: Path) -> None:
    metrics = metrics_file(tmp_path, {"step": 11, "rw/loss": 0.5}, {"step": 12, "eval/loss": 9.0, "rw/loss": 0.25},
                           {"step": 12, "eval/accuracy": 1.0})
    assert _epochs(PROGRESS, metrics) == "epoch 1/2  loss 0.2500"
    assert _epochs(PROGRESS, tmp_path / "none.jsonl") == "epoch 1/2"
    assert _epochs({"step": 3, "reward": 0.5}, metrics) == ""  # grpo: its reward line says it


def test_last_offline_evaluation_metrics() -> None:
    assert _last_eval(PROGRESS) == "accuracy 0.938  reward_margin 1.250"
    assert _last_eval({"epoch": 0, "total_epochs": 2}) == ""


def test_detail_prints_epoch_loss_and_eval(tmp_path: Path) -> None:
    metrics = metrics_file(tmp_path, {"step": 12, "dpo/loss": 0.125})
    row = TrialRow("e/t", "7", "RUNNING", "1:00", "node1", "2026-01-01 00:00", str(tmp_path), "12/16", "")
    detail = TrialDetail(row=row, reason="", exit_code="", components=[], epochs=_epochs(PROGRESS, metrics),
                         last_eval=_last_eval(PROGRESS))
    out = StringIO()
    print_detail(Console(file=out, width=200), detail)
    text = out.getvalue()
    assert "epoch 1/2  loss 0.1250" in text and "last eval: accuracy 0.938  reward_margin 1.250" in text, text


def test_a_trainer_still_running_in_its_records_after_the_job_ended_is_not_shown_running() -> None:
    """`rlkit stop` on a frozen trainer cancels the job with progress.json still saying "running" (the killserver
    trial found status showing a running trainer of a job Slurm had forgotten)."""
    assert trainer_status("running", active=False, state="CANCELLED") == "was running when the job ended (CANCELLED)"
    assert trainer_status("running", active=True, state="RUNNING") == "running"
    assert trainer_status("stopped", active=False, state="CANCELLED") == "stopped"

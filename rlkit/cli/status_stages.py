"""`rlkit status RUN` for a multi-stage run: one line per stage (its trial, job, Slurm state, progress, whether its
final model is written), read from the run's record (rlkit.trials.stage_runs) and each stage's trial files."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from rlkit.cli.console import TITLE, literal
from rlkit.cli.status import read_progress
from rlkit.launch import slurm
from rlkit.trials.records import SLURM_JOB_ID, attempts
from rlkit.trials.stage_runs import StagedRun


@dataclass
class StageRow:
    """One stage as status shows it. `state`: the Slurm state of its last job, NOT SUBMITTED when it has none."""

    stage: str
    type: str
    trial: str
    job_id: str
    state: str
    progress: str
    final: bool
    trial_dir: str


@dataclass
class RunDetail:
    name: str
    stages: list[StageRow]

    @property
    def current(self) -> str:
        """The first stage without its final model ("" when every stage finished)."""
        return next((row.stage for row in self.stages if not row.final), "")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "current_stage": self.current, "stages": [asdict(r) for r in self.stages]}


def run_detail(run: StagedRun) -> RunDetail:
    rows = []
    for stage in run.stages:
        found = attempts(stage.paths)
        job_id = str(found[-1].get("job_id")) if found else ""
        if not job_id:
            state = "NOT SUBMITTED"
        elif not SLURM_JOB_ID.fullmatch(job_id):  # a hand-edited manifest: not passed to scontrol
            state = "UNKNOWN"
        else:
            state = slurm.trials_job_info(job_id, run.experiment, stage.trial, stage.trial_dir).state
        progress = read_progress(stage.paths)
        text = f"step {progress['step']}/{progress['total_steps']}" if "step" in progress else ""
        rows.append(StageRow(stage.name, stage.type, stage.trial, job_id, state, text, stage.finished(),
                             stage.trial_dir))
    return RunDetail(run.name, rows)


def run_table(detail: RunDetail) -> Table:
    table = Table(title=literal(f"{detail.name}: {len(detail.stages)} stage(s)"
                                + (f", now at stage {detail.current}" if detail.current else ", all finished"), TITLE))
    for column in ("stage", "type", "trial", "job", "state", "progress", "final model"):
        table.add_column(column, no_wrap=True)
    for r in detail.stages:
        table.add_row(*map(literal, (r.stage, r.type, r.trial, r.job_id, r.state, r.progress)),
                      "yes" if r.final else "no")
    return table

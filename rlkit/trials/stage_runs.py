"""The per-user record of multi-stage runs (`stages:` in a config, rlkit.launch.stages): which stage trials make up a
run, in order, so `rlkit status` and `rlkit resume` can act on the run as a whole. Each stage is also an ordinary
trial of the index (rlkit.trials.records), so `rlkit logs`, `stop` and `status` work on one stage as on any trial."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import read_json_dict, rlkit_home, skip_record, write_atomic

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # experiment and trial names (rlkit.checks.experiment.check_name)


@dataclass(frozen=True)
class StageRecord:
    """One stage of a run. `model_stand_in`: the model its submit-time checks read instead of actor.path while that
    is an earlier stage's final checkpoint not written yet (empty: actor.path is its own). `reward_stand_in`: the same
    for reward.reward_model_path (and a critic.path) handed over from an earlier rw stage (rlkit.launch.stage_reward):
    the model that stage trains from."""

    name: str
    type: str
    trial: str
    trial_dir: str
    model_stand_in: str = ""
    reward_stand_in: str = ""

    @property
    def stand_ins(self) -> bool:
        """Whether a model this stage reads is an earlier stage's final checkpoint."""
        return bool(self.model_stand_in or self.reward_stand_in)

    @property
    def paths(self) -> TrialPaths:
        return TrialPaths(Path(self.trial_dir))

    def finished(self) -> bool:
        """The stage's trainer wrote its final model (checkpoints/final appears, by rename, only when complete)."""
        return (self.paths.checkpoints / "final").is_dir()


@dataclass(frozen=True)
class StagedRun:
    """A run of stages, named `experiment/trial` like a trial; its stages are the trials `<trial>_<stage>`."""

    experiment: str
    trial: str
    stages: tuple[StageRecord, ...]
    submitted_at: float

    @property
    def name(self) -> str:
        return f"{self.experiment}/{self.trial}"

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)


def _index() -> Path:
    return rlkit_home() / "staged"


def record_run(run: StagedRun) -> None:
    """Add (or replace) the run in the per-user index."""
    folder = _index() / run.experiment
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / f"{run.trial}.json", json.dumps(asdict(run), indent=1) + "\n")


def _read(path: Path) -> StagedRun | None:
    """The run recorded in `path`; None when there is none, and (with a warning) when the record is not one rlkit
    wrote: a stage whose fields are not strings (a hand-edited file) is never used as a trial directory."""
    if not path.is_file():
        return None
    data = read_json_dict(path)
    try:
        stages = tuple(StageRecord(**s) for s in data["stages"])
        run = StagedRun(str(data["experiment"]), str(data["trial"]), stages, float(data["submitted_at"]))
    except (KeyError, TypeError, ValueError):
        skip_record(path, "not a record of a run of stages")
        return None
    if not stages or any(not isinstance(value, str) for stage in stages for value in astuple(stage)) \
            or any(not stage.trial_dir for stage in stages):
        skip_record(path, "a stage's fields must be strings (trial_dir non-empty)")
        return None
    return run


def find_run(spec: str) -> StagedRun | None:
    """The run named `experiment/trial` (or a bare trial name, when one experiment has it); None when `spec`
    names no run (it may still name an ordinary trial)."""
    experiment, _, trial = spec.rpartition("/")
    if not _NAME.fullmatch(trial) or (experiment and not _NAME.fullmatch(experiment)):
        return None  # not a name a run can have (and never a path to read from)
    folders = [_index() / experiment] if experiment else sorted(p for p in _index().glob("*") if p.is_dir())
    found = [run for folder in folders if (run := _read(folder / f"{trial}.json")) is not None]
    return found[0] if len(found) == 1 else None


def run_of_trial(trial_dir: str) -> tuple[StagedRun, StageRecord] | None:
    """The run (and stage) a trial directory belongs to, None for a trial of its own."""
    for folder in sorted(p for p in _index().glob("*") if p.is_dir()):
        for path in sorted(folder.glob("*.json")):
            run = _read(path)
            if run is None:
                continue
            for stage in run.stages:
                if stage.trial_dir == trial_dir:
                    return run, stage
    return None

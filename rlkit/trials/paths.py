"""Where a trial's files live on the shared filesystem (pure: no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlkit.step_contract import JOB_END, JOB_LOCK, STEP_STATE, STOP_ACK

# What rlkit itself keeps in a trial directory: no output file of the job may take one of these names.
RESERVED_NAMES = frozenset({"config.yaml", "job.sbatch", "manifest.json", "logs", "secret", "metrics.jsonl",
                            "weights", "checkpoints", "progress.json", STEP_STATE, STOP_ACK, JOB_END, JOB_LOCK,
                            "recover", "name_resolve", "swanlab", "tensorboard", "wandb", "summary.json"})
# where `submit --force` keeps a previous run (rlkit.trials.records.archive_run)
ATTEMPT_DIR = re.compile(r"attempt-(\d+)")


@dataclass(frozen=True)
class TrialPaths:
    """The layout of `<fileroot>/<experiment>/<trial>/`."""

    root: Path

    @classmethod
    def of(cls, fileroot: str | Path, experiment: str, trial: str) -> TrialPaths:
        return cls(Path(fileroot) / experiment / trial)

    @property
    def config(self) -> Path:
        """The resolved config every in-job step reads."""
        return self.root / "config.yaml"

    @property
    def script(self) -> Path:
        """The rendered sbatch script."""
        return self.root / "job.sbatch"

    @property
    def manifest(self) -> Path:
        """What was submitted: job id, time, versions, images."""
        return self.root / "manifest.json"

    @property
    def source_id(self) -> Path:
        """The source id (rlkit.source_id) of the rlkit that validated and submitted this job: step 0 on every node
        holds its own rlkit to it."""
        return self.root / "rlkit-source"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def step_log(self, step: str) -> Path:
        """One log file per step (server-0, generate, trainer, ...)."""
        return self.logs / f"{step}.log"

    @property
    def batch_log(self) -> Path:
        """The batch script's own output (%j: the job id)."""
        return self.logs / "slurm-%j.out"

    @property
    def token(self) -> Path:
        """The per-trial secret (mode 0600) that steps use to talk to each other."""
        return self.root / "secret" / "token"

    def output(self, name: str) -> Path:
        """A result file of the job, relative to the trial directory."""
        return self.root / name

    @property
    def summary(self) -> Path:
        """A scored generate run's figures (mean reward, pass@k: rlkit.jobs.generate.summary), read by status."""
        return self.root / "summary.json"

    @property
    def metrics(self) -> Path:
        """Per-step training metrics, one JSON object a line (always written by grpo)."""
        return self.root / "metrics.jsonl"

    @property
    def weights(self) -> Path:
        """Weight versions written for the servers (disk weight sync): weights/version-<N>/."""
        return self.root / "weights"

    @property
    def checkpoints(self) -> Path:
        """Saved Hugging Face models: checkpoints/step<N>/ (and the final one)."""
        return self.root / "checkpoints"

    @property
    def progress(self) -> Path:
        """The trainer's latest step, reward and weight version (read by `rlkit status`)."""
        return self.root / "progress.json"

    @property
    def job_end(self) -> Path:
        """How the job ended, written by its script as it exits (rlkit.step_contract.JOB_END)."""
        return self.root / JOB_END

    @property
    def stop_ack(self) -> Path:
        """Rewritten by the trainer when a stop signal reaches it (rlkit.step_contract.STOP_ACK)."""
        return self.root / STOP_ACK

    @property
    def step_state(self) -> Path:
        """The trainer's last step and status for the job script (rlkit.step_contract)."""
        return self.root / STEP_STATE

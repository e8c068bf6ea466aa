"""Submit-time validation of a config against the registered job types: the checks of rlkit.checks.experiment, given
the registry, so that config.type's record says what its job is made of and its own checks run among them."""

from __future__ import annotations

from rlkit.checks.experiment import Validated, check_experiment
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.registry import REGISTRY


def validate(config: ExperimentConfig) -> Validated:
    """Check everything that can be checked without Slurm; collect every problem (never raises for a mistake)."""
    return check_experiment(config, REGISTRY)

"""What the config leaf asks of a config's job type, without importing rlkit.jobs: the caller that knows the job
types hands them in (rlkit.jobs.job_types.JobTypes is a JobTypeLookup, its JobType records are JobFacts). Used where
loading a config depends on its job type: AReaL keys whose meaning does (rlkit.config.areal.keys) and a file
without `type` (rlkit.config.load)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.errors import ConfigError


class JobFacts(Protocol):
    """The facts of one job type that AReaL's keys are judged with."""

    @property
    def trains_on_rollouts(self) -> bool:
        """It computes the policy's log-probs at gconfig.temperature (else at 1)."""
        ...

    @property
    def trains_value_model(self) -> bool:
        """The model it trains is a scalar-head value model."""
        ...

    def needs_reference(self, config: ExperimentConfig) -> bool:
        """Whether its trainer loads a frozen reference model for `config`."""
        ...


class JobTypeLookup(Protocol):
    """The registered job types, as the loader asks them."""

    def facts_of(self, name: str) -> JobFacts | None:
        """The job type called `name`; None for an unknown name (validation reports it)."""
        ...

    def guess_type(self, merged: dict[str, Any]) -> str | ConfigError | None:
        """For a file without `type`: None when the schema's default is right, the one type it can be, or the
        error naming the types it fits."""
        ...

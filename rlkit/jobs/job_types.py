"""The registered job types as one object (rlkit.jobs.registry builds the one instance): looked up by name, listed
for hints, and asked to settle a config without `type`. Handed to what must not import the registry: the config
loader (as rlkit.config.job_facts.JobTypeLookup) and the submit-time checks (rlkit.checks.experiment)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from rlkit.errors import ConfigError
from rlkit.jobs.base import JobType
from rlkit.jobs.type_guess import job_type_of


class JobTypes:
    """The registered job types, in their order; `trinity_algorithms`: Trinity-RFT's algorithm_type -> the job
    type `rlkit migrate` makes of it (rlkit.config.trinity is handed this mapping, config never imports jobs);
    `verl_estimators`: verl's algorithm.adv_estimator -> the job type, alike (rlkit.config.verl)."""

    def __init__(self, jobs: tuple[JobType, ...]) -> None:
        self.all = jobs
        self.names = tuple(job.name for job in jobs)
        self._by_name = {job.name: job for job in jobs}
        assert len(self._by_name) == len(jobs), "two job types share a name"
        self.trinity_algorithms = {algorithm: job.name for job in jobs for algorithm in job.trinity}
        assert len(self.trinity_algorithms) == sum(len(job.trinity) for job in jobs), \
            "two job types claim one Trinity-RFT algorithm_type"
        self.verl_estimators = {estimator: job.name for job in jobs for estimator in job.verl}
        assert len(self.verl_estimators) == sum(len(job.verl) for job in jobs), \
            "two job types claim one verl adv_estimator"

    def __iter__(self) -> Iterator[JobType]:
        return iter(self.all)

    def named(self, name: str) -> JobType:
        """The job type called `name`; a ConfigError naming the closest registered one otherwise."""
        job = self._by_name.get(name)
        if job is not None:
            return job
        close = difflib.get_close_matches(name, self.names, n=1, cutoff=0.5)
        guess = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"type '{name}' is not a job type", hint=f"{guess}choose one of: {', '.join(self.names)}")

    def facts_of(self, name: str) -> JobType | None:
        """The job type called `name`; None for an unknown name (validation reports it)."""
        return self._by_name.get(name)

    def guess_type(self, merged: dict[str, Any]) -> str | ConfigError | None:
        """The `type` of a config that sets none (rlkit.jobs.type_guess)."""
        return job_type_of(merged, self.all)

"""Job types as plug-ins (torch-free): `job_type_for(config.type)` says what a job of that type is made of."""

from rlkit.jobs.base import JobType
from rlkit.jobs.job_types import JobTypes
from rlkit.jobs.registry import JOB_TYPES, REGISTRY, job_type_for, registered_job_types

__all__ = ["JOB_TYPES", "REGISTRY", "JobType", "JobTypes", "job_type_for", "registered_job_types"]

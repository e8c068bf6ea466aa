"""Job types as plug-ins (torch-free): `job_type_for(config.type)` says what a job of that type is made of."""

from rlkit.jobs.base import JobType
from rlkit.jobs.registry import JOB_TYPES, job_type_for, registered_job_types

__all__ = ["JOB_TYPES", "JobType", "job_type_for", "registered_job_types"]

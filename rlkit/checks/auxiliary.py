"""Checks of `auxiliary_models` (rlkit.config.schema.auxiliary), every problem with its fix: the names user code
asks for, the server counts and sizes, the backend, the model, and whether the job type runs any code that could ask
them at all. Whether a server fits a node is asked of the rule the planner fits with (rlkit.config.node_fit); how the
groups' nodes add up with the policy servers and the trainer is the planner's check (rlkit.launch.plan), as it is for
allocation_mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.checks.site_files import check_model_dir
from rlkit.config.allocation import Allocation
from rlkit.config.model_config import model_positions
from rlkit.config.node_fit import unit_unplaceable
from rlkit.config.problems import Problems
from rlkit.config.schema.auxiliary import NAME_PATTERN, AuxiliaryModelConfig, entry_field
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.servers.backend import BACKEND_NAMES, backend_for
from rlkit.servers.engine_env import check_engine_env

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes


def validate_auxiliary(config: ExperimentConfig, job: JobType | None, job_types: JobTypes,
                       allocation: Allocation | None, problems: Problems) -> None:
    """Every problem of the auxiliary_models list (nothing to check when it is empty)."""
    entries = config.auxiliary_models
    if not entries:
        return
    if job is not None and not job.auxiliary:
        why = ("trains on its dataset alone: no rollouts, so no reward function" if not job.needs_servers else
               "runs no reward function")
        users = ", ".join(j.name for j in job_types if j.auxiliary)
        problems.add(f"auxiliary_models is set, but job type {job.name} {why} that could call them: their servers "
                     "would only hold GPUs", hint=f"remove auxiliary_models (the reward functions of {users} "
                                                  "call them)")
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        _check_entry(config, index, entry, allocation, problems)
        if entry.name in seen:
            problems.add(f"{entry_field(index, 'name')} '{entry.name}' is also the name of auxiliary_models"
                         f"[{seen[entry.name]}]: user code could not tell them apart",
                         hint="give each auxiliary model its own name")
        seen.setdefault(entry.name, index)


def _check_entry(config: ExperimentConfig, index: int, entry: AuxiliaryModelConfig, allocation: Allocation | None,
                 problems: Problems) -> None:
    def field(name: str) -> str:
        return entry_field(index, name)

    if not NAME_PATTERN.fullmatch(entry.name):
        problems.add(f"{field('name')} {entry.name!r} is not an identifier of letters, digits and '_' starting "
                     "with a letter (at most 32 characters): it names the job's steps and name-resolve records",
                     hint=f"e.g. {field('name')}=judge")
    gpn = config.cluster.n_gpus_per_node
    tp = entry.tensor_parallel_size
    if tp >= 1 and gpn >= 1 and unit_unplaceable(tp, gpn) is not None:  # the planner's rule (rlkit.config.node_fit)
        problems.add(f"{field('tensor_parallel_size')} {tp} does not fit one server on a node of "
                     f"cluster.n_gpus_per_node={gpn} GPUs (a server never straddles nodes)",
                     hint=f"use a tensor_parallel_size of at most {gpn}")
    _check_backend(config, index, entry, allocation, problems)
    if not entry.model_path:
        problems.add(f"{field('model_path')} is empty", hint="set it to a Hugging Face model directory or hub id")
    else:
        with problems.check():
            check_model_dir(field("model_path"), entry.model_path)
    if entry.max_model_len is not None:
        positions = model_positions(entry.model_path)
        if entry.max_model_len < 1:
            problems.add(f"{field('max_model_len')} must be at least 1 (got {entry.max_model_len})",
                         hint="or leave it unset: the model's own context")
        elif positions is not None and entry.max_model_len > positions:
            problems.add(f"{field('max_model_len')} ({entry.max_model_len}) exceeds the model's context of "
                         f"{positions} tokens (max_position_embeddings of {entry.model_path}): the servers would "
                         "refuse to start", hint=f"set it to at most {positions}, or leave it unset")


def _check_backend(config: ExperimentConfig, index: int, entry: AuxiliaryModelConfig, allocation: Allocation | None,
                   problems: Problems) -> None:
    """A known engine; its section's extra_args acceptable (the policy's own backend is checked with the policy); in
    containers, the engine the one inference-server image holds."""
    field = entry_field(index, "backend")
    if entry.backend not in BACKEND_NAMES:
        problems.add(f"{field} '{entry.backend}' is not an inference engine rlkit runs",
                     hint=f"choose one of: {', '.join(BACKEND_NAMES)}")
        return
    policy = allocation.server.backend if allocation is not None and allocation.server is not None else None
    backend = backend_for(entry.backend)
    if entry.backend != policy:
        for name, message in backend.extra_args_problems(getattr(config, backend.name).extra_args):
            problems.add(f"{name}: {message}")
        check_engine_env(config, backend, problems)
    if config.launcher.slurm.container_type == "apptainer" and policy is not None and entry.backend != policy:
        problems.add(f"{field} is {entry.backend}, but every server runs in launcher.slurm.inference_server_image, "
                     f"which serves the policy with {policy}", hint=f"set {field}={policy}")

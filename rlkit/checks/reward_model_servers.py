"""Checks of the reward model's own servers (`reward.reward_model_engine_num` > 0, rlkit.config.served_models), every
problem with its fix: they fit a node, their name is theirs, vLLM can run where they run, their context fits the
model and holds a prompt and its completion. The knobs set while nothing reads them (no `reward_model` in the
reward, engine_num 0, a job type scoring on its own step) are refused by the conditional-knob table
(rlkit.checks.conditional_knobs). How their nodes add up with the other components is the planner's check
(rlkit.launch.plan), as for auxiliary_models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.config.allocation import Allocation
from rlkit.config.model_config import model_positions
from rlkit.config.node_fit import unit_unplaceable
from rlkit.config.problems import Problems
from rlkit.config.schema.auxiliary import entry_field
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.config.served_models import (
    CONTEXT_FIELD,
    ENGINE_NUM_FIELD,
    REWARD_MODEL,
    REWARD_SERVERS_BACKEND,
    TP_FIELD,
    serves_reward_model,
)
from rlkit.servers.backend import backend_for
from rlkit.servers.engine_env import check_engine_env

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType


def validate_reward_model_servers(config: ExperimentConfig, job: JobType | None, allocation: Allocation | None,
                                  problems: Problems) -> None:
    """Every problem of the reward model's servers (nothing to check when it is scored on trainer rank 0)."""
    if not serves_reward_model(config) or job is None or not job.auxiliary:
        return
    reward = config.reward
    for index, entry in enumerate(config.auxiliary_models):
        if entry.name == REWARD_MODEL:
            problems.add(f"{entry_field(index, 'name')} '{REWARD_MODEL}' is the name of the reward model's servers "
                         f"({ENGINE_NUM_FIELD}={reward.reward_model_engine_num}): the two could not be told apart",
                         hint=f"give the auxiliary model another name, e.g. {entry_field(index, 'name')}=judge")
    gpn, tp = config.cluster.n_gpus_per_node, reward.reward_model_tensor_parallel_size
    if gpn >= 1 and unit_unplaceable(tp, gpn) is not None:  # the planner's rule (rlkit.config.node_fit)
        problems.add(f"{TP_FIELD} {tp} does not fit one server on a node of cluster.n_gpus_per_node={gpn} GPUs (a "
                     "server never straddles nodes)", hint=f"use a {TP_FIELD} of at most {gpn}")
    _check_backend(config, allocation, problems)
    context = reward.reward_model_max_model_len
    positions = model_positions(reward.reward_model_path) if reward.reward_model_path else None
    if context is not None and positions is not None and context > positions:
        problems.add(f"{CONTEXT_FIELD} ({context}) exceeds the reward model's context of {positions} tokens "
                     f"(max_position_embeddings of {reward.reward_model_path}): its servers would refuse to start",
                     hint=f"set it to at most {positions}, or leave it unset")
    _check_room(config, job, context, positions, problems)


def _check_room(config: ExperimentConfig, job: JobType, context: int | None, positions: int | None,
                problems: Problems) -> None:
    """The servers' context holds the longest prompt and its completion: vLLM refuses a longer pooling input (400,
    "maximum context length"), so every such completion would score 0 mid-run (an error per call)."""
    limit, where = ((context, CONTEXT_FIELD) if context is not None else
                    (positions, f"the max_position_embeddings of {config.reward.reward_model_path}"))
    if limit is None:
        return
    new = config.gconfig.max_new_tokens
    what = f"the reward model's servers' context of {limit} tokens ({where})"
    raise_it = f"raise {CONTEXT_FIELD}" if context is not None and (positions is None or context < positions) else \
        f"score on trainer rank 0's CPU ({ENGINE_NUM_FIELD}=0)"
    if new >= limit:
        problems.add(f"gconfig.max_new_tokens ({new}) leaves no room for a prompt in {what}: vLLM would refuse "
                     "every completion that long, which would score 0",
                     hint=f"lower gconfig.max_new_tokens below {limit}, or {raise_it}")
        return
    field = f"{job.prompt_dataset}.max_length" if job.prompt_dataset else ""
    prompt = get_field(config, field) if field else None
    if isinstance(prompt, int) and prompt + new > limit:
        problems.add(f"a prompt of up to {prompt} tokens ({field}) plus gconfig.max_new_tokens ({new}) exceeds "
                     f"{what}: vLLM would refuse the longest prompts' completions, which would score 0",
                     hint=f"keep {field} + gconfig.max_new_tokens <= {limit}, or {raise_it}")


def _check_backend(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """The servers run vLLM's pooling runner: in containers the one inference-server image must hold vLLM (it
    serves the policy); on a bare host a policy served by another engine leaves vLLM's section unchecked so far."""
    policy = allocation.server.backend if allocation is not None and allocation.server is not None else None
    if policy == REWARD_SERVERS_BACKEND:
        return  # the policy's own checks covered vLLM's section
    if config.launcher.slurm.container_type == "apptainer" and policy is not None:
        problems.add(f"{ENGINE_NUM_FIELD} > 0 serves the reward model with vLLM, but every server runs in "
                     f"launcher.slurm.inference_server_image, which serves the policy with {policy}",
                     hint=f"serve the policy with vLLM too (allocation_mode vllm:...), or set {ENGINE_NUM_FIELD}=0 "
                          "(trainer rank 0 scores on its CPU)")
        return
    backend = backend_for(REWARD_SERVERS_BACKEND)
    for name, message in backend.extra_args_problems(config.vllm.extra_args):
        problems.add(f"{name}: {message}")
    check_engine_env(config, backend, problems)

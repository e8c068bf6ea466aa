"""How long trainer rank 0 of an RL job (grpo and the job types built on it) may work alone, from its config.

Rank 0 alone talks to the servers: while it waits for a batch of rollouts, pushes weights or waits for an
evaluation, the other ranks wait for its next broadcast (`rlkit.trainer.dist.broadcast_object`). Each of those
waits of rank 0 has its own deadline and its own message; the other ranks must wait at least as long, or a slow but
healthy rollout (rollout.request_timeout is an hour by default) fails them first with torch's collective timeout
(30 minutes), which names nothing.
"""

from __future__ import annotations

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import served_auxiliary_models
from rlkit.servers.pool import most_retry_wait
from rlkit.trainer.dist import COLLECTIVE_TIMEOUT_S, TrainerWaits
from rlkit.trainer.evaluator import episode_bound, eval_wait_bound
from rlkit.weights.xccl_group import HTTP_MARGIN_S

# rank 0's own work between its deadlines (metrics, the checkpoint's decision, a resume of the servers at start)
RANK0_MARGIN_S = 600.0


def batch_wait_s(config: ExperimentConfig) -> float:
    """How long rank 0 waits for a batch of rollouts: a request with every retry (rollout.request_timeout x
    (request_retries + 1)) and the waits between them, for an agent run's episodes max_turns of those with their tool
    calls (rlkit.trainer.evaluator.episode_bound: a healthy run of long turns outlasted one request's bound), and a
    minute."""
    retries = config.rollout.request_retries
    request = config.rollout.request_timeout * (retries + 1) + most_retry_wait(retries)
    return episode_bound(config, request) + 60


def push_wait_s(config: ExperimentConfig) -> float:
    """A push's waits on the servers: the delivery, then the version and fingerprint check, each bounded by
    2 x actor.weight_update_timeout + 60 s (rlkit.weights.disk, rlkit.weights.fanout), the fingerprint's probe also
    by its queue behind generation (rollout.request_timeout: rlkit.weights.fanout.Probe)."""
    return 2 * (2 * config.actor.weight_update_timeout + 60) + config.rollout.request_timeout


def rank0_wait_bound(config: ExperimentConfig, *, scored: bool = False) -> float:
    """The longest rank 0 may work alone between two broadcasts: at start, the auxiliary models' servers' and then
    the policy's registration (rollout.setup_timeout each) and the first check; in a step, a batch (`scored`: then
    scored by a teacher, as long again), an evaluation it waits for (rlkit.trainer.evaluator) and a push; after the
    last step's push, two evaluations (Evaluator.after_step: the one still running, then the final weights'), which
    outlast a batch when an agent's evaluation runs max_turns turns."""
    start = config.rollout.setup_timeout * (2 if served_auxiliary_models(config) else 1) + push_wait_s(config)
    step = batch_wait_s(config) * (2 if scored else 1) + eval_wait_bound(config) + push_wait_s(config)
    last = push_wait_s(config) + 2 * eval_wait_bound(config)
    return max(start, step, last) + RANK0_MARGIN_S


def trainer_waits(config: ExperimentConfig, *, scored: bool = False) -> TrainerWaits:
    """The RL trainer's collective timeouts: rank 0's broadcasts wait `rank0_wait_bound`; every other collective the
    default, or longer when one bucket of a broadcast push may take longer: its wait in the shared group, then the
    servers that survived it joining and receiving it alone (actor.weight_update_timeout and the margins of
    rlkit.weights.xccl_group each), while the other ranks wait in the next bucket's all-gather."""
    bucket_s = 2 * (config.actor.weight_update_timeout + 2 * HTTP_MARGIN_S) + 60
    return TrainerWaits(collective_s=max(COLLECTIVE_TIMEOUT_S, bucket_s),
                        rank0_s=rank0_wait_bound(config, scored=scored))

"""Submit-time checks of the GRPO fields (what every trainer shares is in rlkit.checks.trainer): every
mistake is collected, naming its fix.

These run on the login node before anything is written or submitted, so a job never dies minutes later in the
queue for a typo: the dataset exists and has the prompt column, the reward function imports, the batch splits into
minibatches and trainer ranks, the model has a tokenizer, and every choice field holds one of its choices.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from rlkit.checks.algo import validate_algorithm, validate_kl_control
from rlkit.checks.prompt_tools import check_prompt_tools
from rlkit.checks.reasoning_gym import validate_reasoning_gym
from rlkit.checks.reward import answer_gap, answer_readers, validate_reward
from rlkit.checks.site_files import check_dataset_file
from rlkit.checks.trainer import validate_trainer
from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.actor import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PROX_LOGP_METHODS,
    WEIGHT_UPDATE_MODES,
    approximates_proximal,
)
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.config.schema.reasoning_gym import names_reasoning_gym
from rlkit.data.dataset_head import dataset_head
from rlkit.data.row_formats import has_prompt
from rlkit.errors import ConfigError
from rlkit.jobs.sft.checks import validate_sft_row_keys

CHOICES: dict[str, tuple[str, ...]] = {
    "actor.importance_sampling_level": ("token", "sequence"),
    "actor.prox_logp_method": PROX_LOGP_METHODS,
    "actor.weight_update_mode": WEIGHT_UPDATE_MODES,  # the transports rlkit.weights.base registers by these names
    "actor.loss_agg_mode": LOSS_AGG_MODES,  # rlkit.trainer.rl_math.aggregation
    "actor.policy_loss": POLICY_LOSSES,  # rlkit.trainer.rl_math.losses
}


def validate_training(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """Add every problem of the grpo fields to `problems`."""
    g, ds = config.gconfig, config.train_dataset
    for dotted, choices in CHOICES.items():
        value = get_field(config, dotted)
        if value not in choices:
            problems.add(f"{dotted} '{value}' is not one of: {', '.join(choices)}", hint=f"e.g. {dotted}={choices[0]}")
    validate_trainer(config, problems)
    _validate_weight_update(config, problems)
    with problems.check():
        _validate_dataset(config)
    validate_reasoning_gym(config, problems)
    if config.expert_dataset.path:  # the SFT+RL mix's rows (rlkit.jobs.grpo.expert)
        with problems.check():
            check_dataset_file("expert_dataset.path", config.expert_dataset.path)
        validate_sft_row_keys(config, ("expert_dataset",), problems)
    validate_reward(config, problems)  # imports the user's reward module
    if g.temperature == 0:  # below 0 is refused by its range (rlkit.config.ranges)
        problems.add(f"gconfig.temperature {g.temperature}: GRPO samples, so it must be > 0",
                     hint="e.g. gconfig.temperature=1.0")
    _validate_batch(config, allocation, problems)
    _validate_actor(config, problems)
    if config.rollout.consumer_batch_size not in (1, ds.batch_size):
        problems.add(f"rollout.consumer_batch_size ({config.rollout.consumer_batch_size}) differs from "
                     f"train_dataset.batch_size ({ds.batch_size}): rlkit trains on train_dataset.batch_size groups "
                     "per step", hint=f"remove rollout.consumer_batch_size or set it to {ds.batch_size}")


def _validate_dataset(config: ExperimentConfig) -> None:
    """The training rows hold the prompt column and the answer column a built-in reward reads: JSON Lines, and
    Parquet where pyarrow is installed here (without it a Parquet file's columns are checked in the job)."""
    ds = config.train_dataset
    if not ds.path:
        raise ConfigError("train_dataset.path is not set", hint="give a .jsonl or .parquet file of prompts")
    if names_reasoning_gym(ds.path):
        return  # generated in the job: rlkit.checks.reasoning_gym
    check_dataset_file("train_dataset.path", ds.path)
    head = dataset_head("train_dataset.path", Path(ds.path))  # None: checked in the job (e.g. Parquet, no pyarrow)
    if head is None:
        return
    columns = ", ".join(head.columns) or "none"
    if not has_prompt(head.columns, head.first_row, ds.prompt_key):
        raise ConfigError(f"train_dataset.path: rows have no column '{ds.prompt_key}' (columns: {columns})",
                          hint="set train_dataset.prompt_key to the prompt column")
    # grpo sends a string prompt as raw text (an episode renders its own first prompt)
    check_prompt_tools("train_dataset", ds, head, chat_template=False,
                       episodes=bool(config.rollout.agent.workflow))
    needs_answer = answer_readers(config)
    gap = answer_gap(head, config.reward.answer_key, "the dataset rows") if needs_answer else None
    if gap:
        raise ConfigError(f"reward.fn {needs_answer[0]} needs {gap}",
                          hint="set reward.answer_key to the reference-answer column (or nested field, e.g. "
                               "reward_model.ground_truth)")


def _validate_batch(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    actor, g, ds = config.actor, config.gconfig, config.train_dataset
    if actor.group_size != g.n_samples and actor.group_size >= 1 and g.n_samples >= 1:  # else: their ranges
        problems.add(f"actor.group_size ({actor.group_size}) differs from gconfig.n_samples ({g.n_samples}); "
                     "a GRPO group is the completions of one prompt", hint=f"set actor.group_size={g.n_samples}")
    if ds.batch_size < 1 or actor.ppo_n_minibatches < 1:
        return  # refused by their ranges (rlkit.config.ranges)
    samples = ds.batch_size * actor.group_size
    if samples % actor.ppo_n_minibatches:
        problems.add(f"a batch of {ds.batch_size} prompts x {actor.group_size} samples = {samples} sequences "
                     f"does not split into actor.ppo_n_minibatches={actor.ppo_n_minibatches} equal minibatches",
                     hint="choose train_dataset.batch_size and ppo_n_minibatches so that the number of "
                          "sequences is a multiple of ppo_n_minibatches")
    ranks = allocation.trainer.dp if allocation is not None and allocation.trainer is not None else 1
    if samples < ranks * actor.ppo_n_minibatches:
        problems.add(f"{samples} sequences per step are fewer than {ranks} trainer ranks x "
                     f"{actor.ppo_n_minibatches} minibatches: some ranks would have nothing to train on",
                     hint="raise train_dataset.batch_size or lower actor.ppo_n_minibatches")


def _validate_actor(config: ExperimentConfig, problems: Problems) -> None:
    actor, g = config.actor, config.gconfig
    validate_algorithm(actor, problems)
    validate_kl_control(actor, max(0, config.train_dataset.batch_size * actor.group_size), problems)
    stale = config.rollout.max_head_offpolicyness
    if approximates_proximal(actor) and stale < 2:  # rlkit.trainer.rl_math.proximal: alpha 0 up to 1 version behind
        problems.add(f"actor.prox_logp_method loglinear with rollout.max_head_offpolicyness {stale}: no token is more "
                     "than one weight version behind the trainer, so the interpolation weight is 0 everywhere and the "
                     "proximal policy would be the servers' log-probs (the same as actor.use_decoupled_loss=false "
                     "with actor.recompute_logprob=false)",
                     hint="raise rollout.max_head_offpolicyness to 2 or more, or use actor.prox_logp_method=recompute")
    if actor.overlong_reward_penalty:
        if actor.overlong_tokens is None or actor.overlong_penalty_factor is None:
            problems.add("actor.overlong_reward_penalty needs actor.overlong_tokens and actor.overlong_penalty_factor",
                         hint="e.g. actor.overlong_tokens=256 actor.overlong_penalty_factor=1")
        elif actor.overlong_tokens > g.max_new_tokens:
            problems.add(f"actor.overlong_tokens {actor.overlong_tokens} must be in "
                         f"1..gconfig.max_new_tokens ({g.max_new_tokens})")
    _validate_loss_agg(config, problems)


def _validate_loss_agg(config: ExperimentConfig, problems: Problems) -> None:
    """actor.loss_agg_mode's combinations that have no meaning: a constant without the mode that divides by it, and
    a per-sequence mean beside the SFT+RL mix, whose expert rows' loss is weighed by tokens."""
    actor = config.actor
    if actor.loss_scale_factor is not None and actor.loss_agg_mode != "seq-mean-token-sum-norm":
        problems.add(f"actor.loss_scale_factor is set, but actor.loss_agg_mode is {actor.loss_agg_mode}: only "
                     "seq-mean-token-sum-norm divides by it", hint="remove actor.loss_scale_factor, or set "
                     "actor.loss_agg_mode=seq-mean-token-sum-norm (Dr.GRPO)")
    if actor.loss_agg_mode in LOSS_AGG_MODES[1:] and config.expert_dataset.path:
        problems.add(f"actor.loss_agg_mode {actor.loss_agg_mode} with expert_dataset.path (the SFT+RL mix): the mix "
                     "weighs the RL loss and the expert rows' SFT loss by tokens, so a per-sequence mean has no "
                     "meaning there", hint="remove actor.loss_agg_mode (token-mean), or remove expert_dataset.path")


# apptainer options that give a step its own network namespace: the servers' workers could no longer open a
# connection to trainer rank 0's address, which is how an xccl broadcast group forms (and NCCL also needs the host's
# InfiniBand devices). Flags as apptainer 1.x spells them (`--net`, `--network`, `--network-args`).
_OWN_NETWORK = ("--net", "--network", "--network-args")


def _validate_weight_update(config: ExperimentConfig, problems: Problems) -> None:
    """The weight push: sizes and timeouts in range; xccl only where the servers can reach the trainer."""
    actor = config.actor
    if actor.weight_update_mode != "xccl" or config.launcher.slurm.container_type != "apptainer":
        return
    try:
        words = shlex.split(config.launcher.slurm.apptainer_args)
    except ValueError:
        return  # reported by the launcher checks
    isolated = [w for w in words if w.split("=", 1)[0] in _OWN_NETWORK]
    if isolated:
        problems.add(f"actor.weight_update_mode xccl: launcher.slurm.apptainer_args has {' '.join(isolated)}, which "
                     "gives each step its own network namespace, so the servers' workers cannot connect to trainer "
                     "rank 0 to join the broadcast group",
                     hint="remove the network option from apptainer_args, or use actor.weight_update_mode=disk")

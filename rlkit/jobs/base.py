"""What a job type is: the record every job type registers (rlkit.jobs.registry lists them).

A job type says which components its job has (inference servers or not; a trainer or a GPU-less client step), which
in-job function runs its work, whether it resumes from recover checkpoints, and how its own fields are checked. The
launch side (validate, plan, submit, resume, stop, status) asks the record instead of switching on the name, so a new
job type touches its own module and the registry only. Torch-free: the step is a "module:function" string imported
in the job, never here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlkit.config.schema.actor import kl_terms_on

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig

Validator = Callable[["ExperimentConfig", "Allocation | None", "Problems"], None]


def _no_checks(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """A job type without fields of its own."""


@dataclass(frozen=True)
class JobType:
    """One job type. `needs_servers`: its job starts inference servers (allocation_mode has a server part, and only
    then). `trainer`: its work step is a trainer on GPUs (allocation_mode has an fsdp part) rather than one GPU-less
    client process. `resumable`: it writes recover checkpoints, so the job requeues itself at its time limit,
    `rlkit resume` continues it and `rlkit stop` checkpoints first. `step`: "module:function" called with the
    trial directory and its config. `sections`: the config sections holding its own knobs. `lora`: it trains (and,
    with servers, serves) LoRA adapters when actor.use_lora is set; `no_lora`: why it does not, said when a config
    sets use_lora anyway (empty: the generic reason). `prompt_dataset`: the dataset whose prompts go to the servers
    (its max_length must fit their context), empty when none does. `passes_on`: what its checkpoints/final is, for
    the next stage of a multi-stage run (rlkit.launch.stages): "policy" (a causal LM: the next stage's actor.path),
    "reward_model" (a value model), "" (no model). `auxiliary`: code of its job (the rollouts' reward functions)
    may call `auxiliary_models`, so they are served; other job types refuse them (servers nothing would ask).
    `kl_terms`: its trainer has the KL terms of actor.kl_ctl / kl_loss_coef (a reference model when one is on);
    `ppo_update`: its trainer runs the PPO actor's update (rlkit.trainer.actor: minibatches, passes, the loss's
    average, the KL loss term); `clipped_loss`: that update's loss is PPO's clipped ratio (with SAPO, M2PO and the
    decoupled loss's bounds), where a job type with a loss of its own (opmd) reads none of the clip knobs
    (rlkit.checks.unread_knobs refuses what a job type does not read).
    `always_reference`: its loss needs a frozen reference whatever the KL knobs say (dpo). `own_section`: the
    section only this job type reads, so a config setting it (without `type`) is likely of this type. `rows`: the
    train_dataset.type of the rows it trains on ("" when it trains on none); a type its rows name alone is taken for
    a config without `type`. `trinity`: the Trinity-RFT `algorithm_type` names `rlkit migrate` turns into this job
    type (required, so a new job type says whether Trinity-RFT has it; () when it has none). `verl`: the verl
    `algorithm.adv_estimator` names `rlkit migrate` turns into this job type. `sequence_parallel`:
    every forward its trainer trains through runs the Ulysses split (rlkit.trainer.head_logprobs), so
    actor.fsdp.ulysses_sp_size > 1 is allowed."""

    name: str
    help: str
    needs_servers: bool
    trainer: bool
    resumable: bool
    step: str
    trinity: tuple[str, ...]
    verl: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    prompt_dataset: str = ""
    lora: bool = False  # its trainer trains LoRA adapters (actor.use_lora); refused at submit otherwise
    no_lora: str = ""
    passes_on: str = ""
    auxiliary: bool = False
    kl_terms: bool = False
    ppo_update: bool = False
    clipped_loss: bool = False
    always_reference: bool = False
    own_section: str = ""
    rows: str = ""
    sequence_parallel: bool = False
    validate: Validator = field(default=_no_checks, compare=False)

    @property
    def trains_on_rollouts(self) -> bool:
        """Its trainer learns from the servers' rollouts (so it computes log-probs at gconfig.temperature and runs
        rollout.agent's episodes)."""
        return self.needs_servers and self.trainer

    @property
    def trains_value_model(self) -> bool:
        """The model it trains is a scalar-head value model (AReaL's actor.is_critic), not a causal LM."""
        return self.passes_on == "reward_model"

    @property
    def random_start(self) -> bool:
        """actor.init_from_scratch means what it says: trainer-only and reference-free, nothing else loads
        actor.path's weights."""
        return self.trainer and not self.needs_servers and not self.always_reference and not self.kl_terms

    def needs_reference(self, config: ExperimentConfig) -> bool:
        """Whether its trainer loads a frozen reference model for `config`: always (dpo), or for a KL term that is
        on. The one rule, asked by validation and AReaL's keys; its KL part is rlkit.config.schema.actor.kl_terms_on,
        which the trainer's actor asks (dpo's algorithm always loads its reference)."""
        return self.always_reference or (self.kl_terms and kl_terms_on(config.actor))

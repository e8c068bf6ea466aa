"""The `ref` section (AReaL's name): the frozen reference model of the KL terms (grpo/ppo with actor.kl_ctl or
actor.kl_loss_coef > 0) and of dpo, and the two facts every part of rlkit asks about it: whether a job loads one
(`uses_reference`) and which model it is (`reference_path`). Torch-free (the login node reads it).

`path`, `dtype` and `attn_impl` are fields (empty: the actor's); the reference is frozen and in eval mode. AReaL's
other ref keys are judged by rlkit.config.areal.keys (REF).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.fields import _f

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig

KL_JOB_TYPES = ("grpo", "ppo")  # the job types whose trainer has the KL terms of actor.kl_ctl / kl_loss_coef


@dataclass
class RefConfig:
    """The frozen reference model of a KL term (actor.kl_ctl, actor.kl_loss_coef) or of dpo."""

    path: str = _f("", "Hugging Face directory (or hub id) of the frozen reference model, e.g. the SFT model when "
                       "actor.path is a later checkpoint; empty: actor.path (the model training starts from). Same "
                       "vocabulary as the actor; with actor.use_lora another model is loaded as a second frozen "
                       "copy (empty: the base without the adapter, no copy). Refused when nothing uses a reference.")
    dtype: str = _f("", "Compute dtype of the reference's forward passes (bfloat16, float16, float32); empty: "
                        "actor.dtype. Another dtype than the actor's with actor.use_lora loads a second copy.")
    attn_impl: str = _f("", "Attention kernel of the reference (flash_attention_2, sdpa, eager); empty: "
                            "actor.attn_impl. flash_attention_2 falls back to sdpa without flash-attn.")


@dataclass(frozen=True)
class ReferenceLoad:
    """What the trainer loads as the reference: the model, its compute dtype and its attention kernel."""

    path: str
    dtype: str
    attn_impl: str


def uses_reference(config: ExperimentConfig) -> bool:
    """Whether the job's trainer loads a reference model: dpo always, grpo/ppo for a KL term (the one rule, as
    rlkit.trainer.reference.needs_reference has it for the trainer)."""
    actor = config.actor
    return config.type == "dpo" or (config.type in KL_JOB_TYPES and (actor.kl_ctl > 0 or actor.kl_loss_coef > 0))


def reference_field(config: ExperimentConfig) -> str:
    """The field that names the reference model: dpo.ref_path (dpo's own, when set), ref.path, else actor.path."""
    if config.type == "dpo" and config.dpo.ref_path:
        return "dpo.ref_path"
    return "ref.path" if config.ref.path else "actor.path"


def reference_path(config: ExperimentConfig) -> str:
    """The model the reference is loaded from (see `reference_field`)."""
    field = reference_field(config)
    return {"dpo.ref_path": config.dpo.ref_path, "ref.path": config.ref.path}.get(field, config.actor.path)


def reference_load(config: ExperimentConfig) -> ReferenceLoad:
    """The reference's model, dtype and attention kernel, the actor's where the ref section leaves them empty."""
    return ReferenceLoad(reference_path(config), config.ref.dtype or config.actor.dtype,
                         config.ref.attn_impl or config.actor.attn_impl)


def loads_a_copy(actor: ActorConfig, load: ReferenceLoad) -> bool:
    """Whether the reference is a model of its own rather than the actor's start: always without LoRA (a frozen copy
    of actor.path), and with LoRA only when it differs from the base the trained peft model computes (another model,
    dtype or attention kernel); else the peft model with its adapter switched off is the reference."""
    return not actor.use_lora or load != ReferenceLoad(actor.path, actor.dtype, actor.attn_impl)


def separate_reference(config: ExperimentConfig) -> bool:
    """`loads_a_copy` for a job's config."""
    return loads_a_copy(config.actor, reference_load(config))

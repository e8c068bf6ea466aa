"""The `ref` section (AReaL's name): the frozen reference model of the KL terms (grpo/ppo with actor.kl_ctl or
actor.kl_loss_coef > 0) and of dpo. Which model a config's reference is: rlkit.config.reference; whether a job loads
one is its job type's answer (rlkit.jobs.base.JobType.needs_reference). Torch-free (the login node reads it).

`path`, `dtype` and `attn_impl` are fields (empty: the actor's); the reference is frozen and in eval mode. AReaL's
other ref keys are judged by rlkit.config.areal.keys (REF).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.fields import _f


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


def loads_a_copy(actor: ActorConfig, load: ReferenceLoad) -> bool:
    """Whether the reference is a model of its own rather than the actor's start: always without LoRA (a frozen copy
    of actor.path), and with LoRA only when it differs from the base the trained peft model computes (another model,
    dtype or attention kernel); else the peft model with its adapter switched off is the reference."""
    return not actor.use_lora or load != ReferenceLoad(actor.path, actor.dtype, actor.attn_impl)

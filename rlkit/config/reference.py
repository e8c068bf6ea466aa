"""Which model a config's frozen reference is, and whether it is a model of its own (`reference_load`,
`separate_reference`): the ref section (rlkit.config.schema.ref) read with the actor's and the job type's own
section. Torch-free (the login node reads it; the trainer loads what it says)."""

from __future__ import annotations

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.ref import ReferenceLoad, loads_a_copy

OWN_REFERENCE = "ref_path"  # a job type's own section (named after it) may name its reference: dpo.ref_path


def own_reference(config: ExperimentConfig) -> str:
    """The reference model the job type's own section names (dpo.ref_path); empty when it has no such field or
    leaves it empty. Its section is named after the job type (sft, rw, dpo, ...)."""
    return str(getattr(getattr(config, config.type, None), OWN_REFERENCE, "") or "")


def reference_field(config: ExperimentConfig) -> str:
    """The field that names the reference model: the job type's own (dpo.ref_path, when set), ref.path, else
    actor.path."""
    if own_reference(config):
        return f"{config.type}.{OWN_REFERENCE}"
    return "ref.path" if config.ref.path else "actor.path"


def reference_path(config: ExperimentConfig) -> str:
    """The model the reference is loaded from (see `reference_field`)."""
    field = reference_field(config)
    if field == "actor.path":
        return config.actor.path
    section, name = field.split(".")
    return str(getattr(getattr(config, section), name))


def reference_load(config: ExperimentConfig) -> ReferenceLoad:
    """The reference's model, dtype and attention kernel, the actor's where the ref section leaves them empty."""
    return ReferenceLoad(reference_path(config), config.ref.dtype or config.actor.dtype,
                         config.ref.attn_impl or config.actor.attn_impl)


def separate_reference(config: ExperimentConfig) -> bool:
    """`loads_a_copy` for a job's config."""
    return loads_a_copy(config.actor, reference_load(config))

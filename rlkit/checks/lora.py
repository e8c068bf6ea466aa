"""Submit-time checks of the LoRA fields (`actor.use_lora`, `lora_rank`, `lora_alpha`, `target_modules`,
`peft_type`): every mistake is collected, naming the field and its fix. Torch-free (the login node runs it).

The target modules must be modules of actor.path (read from its safetensors headers, rlkit.checks.model_modules).
What LoRA needs beyond its own fields in a job with servers (grpo, ppo): the disk transport (an adapter is a small
directory every server loads by path at run time, through vLLM's or SGLang's LoRA routes; there is no broadcast of
adapters), and what the servers' LoRA path takes, as their backend says (ServerBackend.lora_problems: with vLLM a
rank it serves, with SGLang target modules it knows; for both, no extra_args rlkit sets itself). A
trainer-only job (sft, dpo) has none of these limits: its checkpoints are merged models.
"""

from __future__ import annotations

from rlkit.checks.model_modules import check_modules_in_model
from rlkit.config.allocation import Allocation, parse_allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError
from rlkit.servers.backend import backend_for

PEFT_TYPES = ("lora",)


def validate_lora(config: ExperimentConfig, problems: Problems, allocation: Allocation | None = None) -> None:
    """Add every problem of the LoRA fields to `problems`. `allocation` is parsed from the config when not given
    (a bad allocation_mode is reported elsewhere, so it is then skipped here)."""
    actor = config.actor
    if actor.peft_type not in PEFT_TYPES:
        problems.add(f"actor.peft_type: {actor.peft_type!r} is not supported",
                     hint=f"use one of: {', '.join(PEFT_TYPES)} (the only peft method rlkit trains and serves)")
    if not actor.use_lora:
        return
    modules = list(actor.target_modules or [])
    if not modules:
        problems.add("actor.target_modules is empty: use_lora needs the modules that get adapters",
                     hint="e.g. actor.target_modules: [q_proj, k_proj, v_proj, o_proj], or [all-linear]")
    bad = [m for m in modules if not isinstance(m, str) or not m.strip()]
    if bad:
        problems.add(f"actor.target_modules: {bad!r} are not module names", hint="give names like q_proj, up_proj")
    if "lm_head" in modules or "embed_tokens" in modules:
        problems.add("actor.target_modules: adapters on lm_head/embed_tokens are not supported (vLLM's LoRA path "
                     "does not load them, and rlkit merges adapters of linear projections only)",
                     hint="target the attention and MLP projections (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                     "up_proj, down_proj)")
    if modules and not bad:
        check_modules_in_model(actor.path, modules, problems)
    _check_servers(config, problems, allocation)


def _check_servers(config: ExperimentConfig, problems: Problems, allocation: Allocation | None) -> None:
    if allocation is None:
        try:
            allocation = parse_allocation(config.allocation_mode)
        except ConfigError:  # reported by the allocation check; nothing to add here
            return
    server = allocation.server
    if server is None:
        return  # a trainer-only job (sft, dpo): nothing to load adapters into, its checkpoints are merged models
    actor = config.actor
    if actor.weight_update_mode != "disk":
        problems.add(f"actor.weight_update_mode: {actor.weight_update_mode!r} with actor.use_lora: adapters go to "
                     "the servers by disk only (a small directory each server loads under a new name)",
                     hint="set actor.weight_update_mode: disk (or turn off actor.use_lora)")
    found = backend_for(server.backend).lora_problems(config)  # each backend says what its LoRA path serves
    if found is None:
        problems.add(f"actor.use_lora with {server.backend} servers (allocation_mode {config.allocation_mode!r}): "
                     "that backend loads no LoRA adapters",
                     hint="serve with vLLM or SGLang, or turn off actor.use_lora")
    for message, fix in found or []:
        problems.add(message, hint=fix)

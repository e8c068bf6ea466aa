"""Submit-time checks of the LoRA fields (`actor.use_lora`, `lora_rank`, `lora_alpha`, `target_modules`,
`peft_type`): every mistake is collected, naming the field and its fix. Torch-free (the login node runs it).

The target modules must be modules of actor.path (read from its safetensors headers, rlkit.checks.model_modules).
What LoRA needs beyond its own fields in a job with servers (grpo, ppo): the disk transport (an adapter is a small
directory every server loads by path at run time, through vLLM's or SGLang's LoRA routes; there is no broadcast of
adapters), and what the servers' LoRA path takes: a rank vLLM serves and no vllm.extra_args rlkit sets itself; with
SGLang, target modules SGLang knows (`--lora-target-modules`) and no sglang.extra_args rlkit sets itself. A
trainer-only job (sft, dpo) has none of these limits: its checkpoints are merged models.
"""

from __future__ import annotations

from rlkit.checks.model_modules import check_modules_in_model
from rlkit.config.allocation import Allocation, parse_allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError
from rlkit.servers.vllm.command import VLLM_LORA_RANKS

PEFT_TYPES = ("lora",)
# Set by rlkit when actor.use_lora (rlkit.servers.vllm.backend): the same option in vllm.extra_args would clash.
LORA_SERVER_OPTIONS = ("enable_lora", "max_lora_rank")
# SGLang's counterparts (rlkit.servers.sglang.lora.lora_flags), and the target modules SGLang 0.5.23 takes
# (`--lora-target-modules` choices, sglang.srt.utils.common.SUPPORTED_LORA_TARGET_MODULES, of dense models; rlkit
# passes all-linear as SGLang's `all`).
SGLANG_LORA_OPTIONS = ("enable_lora", "max_lora_rank", "lora_target_modules")
SGLANG_LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
                       "gate_up_proj", "all-linear")


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
    if server.backend == "sglang":
        _check_sglang(config, problems)
        return
    if server.backend != "vllm":
        problems.add(f"actor.use_lora with {server.backend} servers (allocation_mode {config.allocation_mode!r}): "
                     "rlkit loads adapters into vLLM and SGLang servers only",
                     hint="serve with vLLM or SGLang, or turn off actor.use_lora")
        return
    if isinstance(actor.lora_rank, int) and actor.lora_rank > VLLM_LORA_RANKS[-1]:
        problems.add(f"actor.lora_rank: {actor.lora_rank} is above the largest rank vLLM serves "
                     f"({VLLM_LORA_RANKS[-1]})", hint=f"use a rank of at most {VLLM_LORA_RANKS[-1]}")
    extra = {str(k).replace("-", "_").lower() for k in config.vllm.extra_args}
    for option in LORA_SERVER_OPTIONS:
        if option in extra:
            problems.add(f"vllm.extra_args.{option}: rlkit sets it itself when actor.use_lora",
                         hint=f"remove {option} from vllm.extra_args (--max-lora-rank follows actor.lora_rank)")


def _check_sglang(config: ExperimentConfig, problems: Problems) -> None:
    """SGLang starts with `--lora-target-modules` (rlkit.servers.sglang.lora): names outside its choices stop it."""
    modules = [m for m in config.actor.target_modules or [] if isinstance(m, str)]
    unknown = [m for m in modules if m not in SGLANG_LORA_MODULES]
    if unknown:
        problems.add(f"actor.target_modules: {unknown!r} are not modules SGLang 0.5.23 serves adapters on "
                     "(its --lora-target-modules choices)",
                     hint=f"use some of: {', '.join(SGLANG_LORA_MODULES)}; or serve with vLLM")
    extra = {str(k).replace("-", "_").lower() for k in config.sglang.extra_args}
    for option in SGLANG_LORA_OPTIONS:
        if option in extra:
            problems.add(f"sglang.extra_args.{option}: rlkit sets it itself when actor.use_lora",
                         hint=f"remove {option} from sglang.extra_args (rlkit derives it from actor.lora_rank and "
                              "actor.target_modules)")

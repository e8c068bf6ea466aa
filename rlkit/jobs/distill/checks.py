"""Submit-time checks of job type distill (beside grpo's): the teacher is an auxiliary model with the student's
tokenizer, the log-probs compared are of the same distributions, and something is learnt. Every problem collected,
each naming its fix. Torch-free.
"""

from __future__ import annotations

from rlkit.checks.token_tables import first_difference
from rlkit.config.model_config import vocab_size
from rlkit.config.problems import Problems
from rlkit.config.schema.auxiliary import entry_field
from rlkit.config.schema.experiment import ExperimentConfig

VLLM_MAX_LOGPROBS = 20  # vLLM 0.32's default --max-logprobs: a larger prompt_logprobs is refused per request


def validate_distill(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the distill section and its teacher to `problems`."""
    d = config.distill
    names = [e.name for e in config.auxiliary_models]
    if d.teacher not in names:
        problems.add(f"distill.teacher '{d.teacher}' is not the name of an auxiliary_models entry (names: "
                     f"{', '.join(names) or 'none'}): the teacher is served as an auxiliary model",
                     hint=f"add auxiliary_models: [{{name: {d.teacher}, model_path: /path/to/teacher}}] or set "
                          "distill.teacher to one of the names")
    else:
        index = names.index(d.teacher)
        _check_teacher(config, index, problems)
    if config.gconfig.temperature != 1.0:
        problems.add(f"gconfig.temperature {config.gconfig.temperature}: distillation compares the student's "
                     "sampling distribution with the teacher's raw one, so the student must sample at 1",
                     hint="set gconfig.temperature=1.0")
    if d.coef == 0 and d.rl_coef == 0 and (not d.topk or d.topk_coef == 0):
        problems.add("distill.coef, distill.rl_coef and the top-k term (distill.topk, distill.topk_coef) are all 0: "
                     "nothing would be learnt", hint="e.g. distill.coef=1.0")
    # distill.rl_coef 0 with the RL advantages' knobs (actor.kl_ctl, reward_norm, ...): rlkit.checks.conditional_knobs
    if d.topk and d.topk_coef > 0 and config.actor.loss_agg_mode != "token-mean":
        problems.add(f"actor.loss_agg_mode {config.actor.loss_agg_mode} with the top-k term (distill.topk, "
                     "distill.topk_coef): that term is a mean over tokens, so a per-sequence mean of the policy loss "
                     "beside it has no meaning", hint="remove actor.loss_agg_mode (token-mean), or set "
                     "distill.topk_coef=0")
    if d.is_clip is not None and not d.topk:
        problems.add("distill.is_clip is set but distill.topk is off: it weighs the top-k term's tokens only (the "
                     "reverse-KL advantages go through the PPO ratio and its clip)", hint="remove distill.is_clip")


def _check_teacher(config: ExperimentConfig, index: int, problems: Problems) -> None:
    entry = config.auxiliary_models[index]
    field = entry_field(index, "model_path")
    tokenizer_field, tokenizer = (("tokenizer_path", config.tokenizer_path) if config.tokenizer_path else
                                  ("actor.path", config.actor.path))
    if entry.model_path and tokenizer:
        differs = first_difference(entry.model_path, tokenizer, "the teacher")
        theirs, ours = vocab_size(entry.model_path), vocab_size(config.actor.path)
        if not differs and theirs is not None and ours is not None and theirs != ours:
            differs = f"vocab_size {theirs} in the teacher's config.json, {ours} in the student's"
        if differs:
            problems.add(f"the teacher's tokenizer ({field} '{entry.model_path}') differs from the student's "
                         f"({tokenizer_field} '{tokenizer}'): {differs}; the teacher would score the student's token "
                         "ids as other tokens", hint="distill from a teacher of the student's model family (the "
                                                     "same tokenizer), or set tokenizer_path to the shared tokenizer")
    topk = config.distill.topk or 0
    if entry.backend == "vllm" and topk > VLLM_MAX_LOGPROBS:
        extra = {str(k).replace("-", "_"): v for k, v in config.vllm.extra_args.items()}
        allowed = extra.get("max_logprobs", VLLM_MAX_LOGPROBS)
        if not isinstance(allowed, int) or topk > allowed:
            problems.add(f"distill.topk {topk} exceeds vLLM's --max-logprobs ({allowed}): the teacher's servers "
                         "would refuse every scoring request",
                         hint=f"lower distill.topk to {VLLM_MAX_LOGPROBS}, or set vllm.extra_args.max_logprobs={topk}")

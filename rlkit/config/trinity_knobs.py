"""Trinity-RFT's sampling, optimizer, clip, prompt and data knobs as rlkit keys, for `rlkit migrate`
(rlkit.config.trinity). They once fell to the generic "rlkit has no such key": a run migrated with its top_p, its
betas or its clip range dropped learned another way under the same name. Each is moved where rlkit has the meaning,
refused naming why where rlkit lacks it (unless the value is Trinity-RFT's default, which changes nothing), and the
infrastructure keys are named with why they do not change what the run learns (INFRA).

Defaults follow Trinity-RFT's config dataclasses (trinity/common/config.py: OptimizerConfig, ModelConfig,
FormatConfig, GenerationConfig) and its PPO policy loss (clip_range 0.2, clip_range_low and _high default to it).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.dotted import finite_number
from rlkit.config.problems import Problems
from rlkit.config.trinity_terms import Left, Moved, Put

TASKSET = "buffer.explorer_input.taskset."
_OPT = "algorithm.optimizer."
_CLIP = "algorithm.policy_loss_fn_args."
_MODEL = "model."

# key (or section, ending in ".") -> why leaving it out changes nothing the run learns
INFRA: dict[str, str] = {
    "ray_namespace": "Ray's namespace: rlkit runs no Ray",
    "ignore_validator_suggestions": "Trinity-RFT's GPU memory advice: rlkit's render checks the plan itself",
    "monitor.": "a metrics sink setting: rlkit's sinks are under stats_logger (metrics.jsonl is always written)",
    "log.": "Ray actors' log files: rlkit's logs are the job's (rlkit logs)",
    "service.": "the Data Juicer service: rlkit runs no data pipeline",
    "explorer.name": "a Ray actor's name",
    "trainer.name": "a Ray actor's name",
    f"{TASKSET}name": "a Ray actor's name",
    "explorer.runner_per_model": "workflow runners per server: rlkit's concurrency is rollout.max_concurrent_rollouts",
    "explorer.concurrent_mode": "how a workflow's repeats run (throughput only)",
    "explorer.max_repeat_times_per_runner": "how a task's repeats are split over runners (throughput only)",
    "explorer.max_timeout": "a workflow's time limit: rlkit's per request is rollout.request_timeout",
    "explorer.max_retry_times": "a workflow's retries: rlkit's per request are rollout.request_retries",
    "explorer.env_vars": "workflow runners' environment: rlkit runs no workflow runners",
    "explorer.runner_state_report_interval": "a progress printout",
    "explorer.dynamic_timeout.": "a workflow's time limit (throughput only)",
    "explorer.over_rollout.": "only with a dynamic sync_style, which rlkit refuses",
    "explorer.auxiliary_models": "models of custom workflows, which rlkit does not run",
    "explorer.rollout_model.enable_history": "a record of a workflow's model calls, which rlkit does not run",
    "explorer.rollout_model.seed": "the servers' sampling seed: rlkit seeds its own",
    "trainer.trainer_type": "verl: rlkit's trainer is its own (FSDP)",
    "trainer.trainer_strategy": "how the trainer shards the model: rlkit's trainer is FSDP",
    "trainer.save_strategy": "how saves are serialised across nodes (speed only)",
    "trainer.save_hf_checkpoint": "rlkit saves Hugging Face models every saver.freq_steps",
    "trainer.fix_actor_microbatch_loss_scale": "how micro-batches weigh in a token-mean: rlkit's token-mean is over "
                                               "the whole minibatch, what true gives",
    "buffer.trainer_input.experience_buffer.": "rlkit's samples go from the servers to the trainer in memory",
    f"{TASKSET}storage_type": "file: rlkit reads files",
    f"{TASKSET}rollout_args.logprobs": "how many log-probs the servers return: rlkit asks for what it needs",
    f"{TASKSET}workflow_args": "arguments of the workflow, which rlkit does not run (rollouts are single-turn "
                               "unless rollout.agent is set)",
    "buffer.explorer_input.default_eval_workflow_type": "rlkit's evaluations are single-turn",
    "model.external_model.": "off: the rollouts come from the model trained",
    "algorithm.advantage_fn_args.epsilon": "added to a group's std before dividing, as rlkit's actor.reward_norm.eps "
                                           "(1e-5): the two differ only for groups whose std is near 0",
}

# key -> (Trinity-RFT's default, why rlkit cannot take another value, the fix): refused unless the default (or absent)
NOT_BUILT: dict[str, tuple[Any, str, str]] = {
    f"{_MODEL}repetition_penalty": (1.0, "rlkit's sampling has no repetition penalty",
                                    "remove it (1.0: none)"),
    f"{_MODEL}rope_scaling": (None, "rlkit loads the model as its config.json says",
                              "write rope_scaling into a copy of the model's config.json and point model_path there"),
    f"{_MODEL}rope_theta": (None, "rlkit loads the model as its config.json says",
                            "write rope_theta into a copy of the model's config.json and point model_path there"),
    f"{_MODEL}custom_chat_template": (None, "rlkit renders prompts with the tokenizer's own chat template",
                                      "put it in a copy of the model's tokenizer_config.json (chat_template)"),
    f"{_MODEL}chat_template_path": (None, "rlkit renders prompts with the tokenizer's own chat template",
                                    "put it in a copy of the model's tokenizer_config.json (chat_template)"),
    f"{TASKSET}format.chat_template": (None, "rlkit renders prompts with the tokenizer's own chat template",
                                       "put it in a copy of the model's tokenizer_config.json (chat_template)"),
    f"{TASKSET}format.system_prompt": (None, "rlkit's RL prompts are the dataset's column as it stands (no system "
                                             "prompt is added)", "write the system message into the rows (a list "
                                                                 "of chat messages in the prompt column)"),
    f"{TASKSET}format.system_prompt_key": (None, "rlkit's RL prompts are the dataset's column as it stands",
                                           "write the system message into the rows (a list of chat messages)"),
    f"{TASKSET}format.reply_prefix": (None, "rlkit does not start the completion with a prefix",
                                      "remove it"),
    f"{TASKSET}subset_name": (None, "rlkit reads a dataset's files (train_dataset.path), not a hub subset",
                              "point buffer.explorer_input.taskset.path at the subset's files"),
    "algorithm.rollout_correction": (None, "Trinity-RFT's rollout importance-sampling correction is not rlkit's",
                                     "leave it out; rlkit's off-policy guard is actor.rejection_sampling"),
    f"{_MODEL}enable_thinking": (None, "rlkit renders prompts with the chat template's defaults (no "
                                       "enable_thinking switch)", "remove it, or bake the switch into the model's "
                                                                  "chat template"),
    "explorer.rollout_model.enable_thinking": (None, "rlkit renders prompts with the chat template's defaults "
                                                      "(no enable_thinking switch)",
                                               "remove it, or bake the switch into the model's chat template"),
    f"{_OPT}lr_warmup_init": (0.0, "rlkit's warmup starts from 0", "remove it"),
    f"{_OPT}lr_decay_steps": (None, "rlkit decays over the whole run", "remove it"),
    f"{_OPT}lr_decay_style": ("constant", "rlkit's schedule is lr_scheduler_type alone", "use lr_scheduler_type"),
    f"{_OPT}min_lr": (None, "rlkit's floor is a ratio of lr", "give it as min_lr_ratio (min_lr / lr)"),
    "algorithm.advantage_fn_args.std_threshold": (None, "rlkit has no per-group std threshold",
                                                  "remove it (rlkit's actor.dynamic_sampling drops groups whose "
                                                  "rewards are all equal)"),
    "buffer.trainer_input.experience_buffer.replay_buffer.enable": (False, "rlkit trains each sample once",
                                                                    "set enable: false"),
}
_SECTIONS_NOT_BUILT = {
    "stages": ("a staged run is read stage by stage (rlkit migrate: rlkit.config.trinity_stages), not as one file",
               "run rlkit migrate on the file"),
    "data_processor": ("its pipelines filter the tasks or reshape the rewards, and rlkit runs no data pipeline",
                       "run the pipeline on the dataset before, or fold the reward shaping into reward.fn"),
}


def infra_reason(key: str) -> str | None:
    """Why the infrastructure key `key` changes nothing learned, or None."""
    for name, why in INFRA.items():
        if key == name or key.startswith(name if name.endswith(".") else f"{name}."):
            return why
    return None


def knobs(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems,
          source: str) -> set[str]:
    """Judge the knobs of this module: move, refuse or name as left out. Returns the keys judged here."""
    judged: set[str] = set()
    for key, (default, why, fix) in NOT_BUILT.items():
        if key in leaves or any(k.startswith(f"{key}.") for k in leaves):
            sub = [k for k in leaves if k == key or k.startswith(f"{key}.")]
            judged |= set(sub)
            value = leaves.get(key)
            if key in leaves and value in (default, None, "", [], {}):
                left(key, f"{value!r}: Trinity-RFT's default, nothing to carry")
            else:
                problems.add(f"{key} ({source}): {why}", hint=fix)
    for section, (why, fix) in _SECTIONS_NOT_BUILT.items():
        sub = [k for k in leaves if k == section or k.startswith(f"{section}.")]
        judged |= set(sub)
        if any(leaves[k] not in (None, [], {}) for k in sub):
            problems.add(f"{section} ({source}): {why}", hint=fix)
        else:
            for key in sub:
                left(key, "empty")
    judged |= _optimizer(leaves, moved, left, put, problems, source)
    judged |= _clip(leaves, moved, left, problems, source)
    judged |= _sampling(leaves, moved, left, problems, source)
    judged |= _prompts(leaves, moved, left, problems, source)
    for name in ("temperature", "top_p", "top_k"):  # the model's, which the taskset's rollout_args override
        key = f"{_MODEL}{name}"
        if key in leaves:
            judged.add(key)
            if f"{TASKSET}rollout_args.{name}" in leaves:
                left(key, f"the taskset's rollout_args.{name} wins, as in Trinity-RFT")
            else:
                moved(key, f"gconfig.{name}", leaves[key], "")
    return judged


# Trinity-RFT's optimizer defaults (OptimizerConfig), written where the file leaves them unset: rlkit's differ
# (lr 2e-5, weight_decay 0.05, betas (0.9, 0.95), warmup 0.001, eps 1e-5); its trainer is verl's, torch's AdamW (eps
# 1e-8). (Trinity-RFT key, rlkit key, value)
OPTIMIZER_DEFAULTS = ((f"{_OPT}lr", "actor.optimizer.lr", 1e-6),
                      (f"{_OPT}weight_decay", "actor.optimizer.weight_decay", 0.01),
                      (f"{_OPT}betas", "actor.optimizer.beta1", 0.9), (f"{_OPT}betas", "actor.optimizer.beta2", 0.999),
                      (f"{_OPT}betas", "actor.optimizer.eps", 1e-8),
                      (f"{_OPT}lr_warmup_steps_ratio", "actor.optimizer.warmup_steps_proportion", 0.0))
_SELECTORS = {"sequential": False, "shuffle": True, "random": True}  # Trinity-RFT's data_selector -> shuffle


def defaults(leaves: dict[str, Any], problems: Problems, source: str) -> list[tuple[str, str, Any, str]]:
    """(Trinity-RFT key, rlkit key, value, how) of each Trinity-RFT default rlkit's differs from, for the keys the
    file leaves unset: the optimizer's, the taskset's order (Trinity-RFT reads it in order unless its
    data_selector shuffles), and with eval tasksets the evaluation's triggers (every 100 steps and at startup)."""
    out = [(key, to, value, "") for key, to, value in OPTIMIZER_DEFAULTS if key not in leaves
           and not (key == f"{_OPT}lr_warmup_steps_ratio" and finite_number(leaves.get(f"{_OPT}lr_warmup_steps"))
                    and leaves[f"{_OPT}lr_warmup_steps"] > 0)]
    if f"{_OPT}betas" in leaves:
        out.append((f"{_OPT}betas", "actor.optimizer.eps", 1e-8, " (torch AdamW's, which Trinity-RFT's trainer uses)"))
    key = f"{TASKSET}data_selector.selector_type"
    selector = leaves.get(key, "sequential")
    if selector not in _SELECTORS:
        problems.add(f"{key} {selector!r} ({source}): rlkit reads the rows shuffled or in order "
                     "(train_dataset.shuffle)", hint="use sequential or shuffle")
    else:
        out.append((key, "train_dataset.shuffle", _SELECTORS[selector], f" ({selector})"))
    if leaves.get("buffer.explorer_input.eval_tasksets"):  # Trinity-RFT's ExplorerConfig evaluates them by default
        out += [(key, to, value, "") for key, to, value in (("explorer.eval_interval", "evaluator.freq_steps", 100),
                                                            ("explorer.eval_on_startup", "evaluator.eval_on_startup",
                                                             True)) if key not in leaves]
    return out


def eval_sampling(taskset: dict[str, Any]) -> dict[str, Any]:
    """eval_gconfig of an eval taskset: its repeat_times (Trinity-RFT's default 1) and its rollout_args."""
    given = taskset.get("rollout_args")
    args: dict[str, Any] = given if isinstance(given, dict) else {}
    out: dict[str, Any] = {"n_samples": taskset.get("repeat_times", 1)}
    out.update({name: args[name] for name in ("temperature", "top_p", "top_k") if name in args})
    return out


def _optimizer(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems,
               source: str) -> set[str]:
    """betas, warmup_style (lr_scheduler_type's older name), lr_warmup_steps, clip_grad and optimizer_type."""
    judged = {k for k in leaves if k in (f"{_OPT}betas", f"{_OPT}warmup_style", f"{_OPT}lr_warmup_steps",
                                         f"{_OPT}lr_warmup_steps_ratio",
                                         f"{_OPT}clip_grad", f"{_OPT}optimizer_type")}
    betas = leaves.get(f"{_OPT}betas")
    if f"{_OPT}betas" in leaves:
        if isinstance(betas, list | tuple) and len(betas) == 2 and all(finite_number(b) and 0 <= b < 1 for b in betas):
            put("actor.optimizer.beta2", betas[1])
            moved(f"{_OPT}betas", "actor.optimizer.beta1", betas[0], f" and actor.optimizer.beta2 {betas[1]}")
        else:
            problems.add(f"{_OPT}betas {betas!r} ({source}) is not two numbers in [0, 1)", hint="e.g. [0.9, 0.999]")
    style = leaves.get(f"{_OPT}warmup_style")
    if f"{_OPT}warmup_style" in leaves:
        if f"{_OPT}lr_scheduler_type" in leaves:
            left(f"{_OPT}warmup_style", "lr_scheduler_type wins (warmup_style is its deprecated name)")
        else:
            moved(f"{_OPT}warmup_style", "actor.optimizer.lr_scheduler_type", style, " (lr_scheduler_type's older "
                                                                                     "name)")
    steps, ratio = leaves.get(f"{_OPT}lr_warmup_steps"), f"{_OPT}lr_warmup_steps_ratio"
    if steps is None or (finite_number(steps) and steps <= 0):  # absent, or off (-1, its default): the ratio is read
        if ratio in leaves:
            moved(ratio, "actor.optimizer.warmup_steps_proportion", leaves[ratio], "")
        if f"{_OPT}lr_warmup_steps" in leaves:
            left(f"{_OPT}lr_warmup_steps", f"{steps!r}: off, lr_warmup_steps_ratio is read")
    else:
        if ratio in leaves:
            left(ratio, "lr_warmup_steps is set and wins, as in Trinity-RFT's verl trainer")
        total: Any = leaves.get("buffer.total_steps") or leaves.get("trainer.total_steps")
        if finite_number(steps) and finite_number(total) and 0 < steps <= total:
            moved(f"{_OPT}lr_warmup_steps", "actor.optimizer.warmup_steps_proportion", steps / total,
                  f" as {steps}/{total} of the total steps")
        else:
            problems.add(f"{_OPT}lr_warmup_steps {steps!r} ({source}): rlkit's warmup is a fraction of the "
                         "total steps, and the file's total (buffer.total_steps) is not a number to divide by",
                         hint="give it as lr_warmup_steps_ratio (warmup steps / total steps)")
    clip = leaves.get(f"{_OPT}clip_grad")
    if f"{_OPT}clip_grad" in leaves:
        trainer = leaves.get("trainer.grad_clip")
        if "trainer.grad_clip" in leaves and trainer != clip:
            problems.add(f"{_OPT}clip_grad {clip!r} and trainer.grad_clip {trainer!r} ({source}) disagree",
                         hint="keep one (rlkit's actor.optimizer.gradient_clipping)")
        elif "trainer.grad_clip" in leaves:
            left(f"{_OPT}clip_grad", "the same as trainer.grad_clip, moved")
        else:
            moved(f"{_OPT}clip_grad", "actor.optimizer.gradient_clipping", clip, "")
    kind = leaves.get(f"{_OPT}optimizer_type")
    if f"{_OPT}optimizer_type" in leaves:
        if kind in (None, "adam", "adamw"):
            left(f"{_OPT}optimizer_type", "rlkit's adam is AdamW, Trinity-RFT's")
        else:
            problems.add(f"{_OPT}optimizer_type {kind!r} ({source}) is not one rlkit has",
                         hint="use adamw (rlkit's actor.optimizer.type adam)")
    return judged


def _clip(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str) -> set[str]:
    """PPO's clip_range, clip_range_low and clip_range_high as actor.eps_clip and actor.eps_clip_higher: the two
    sides default to clip_range in Trinity-RFT."""
    keys = {name: f"{_CLIP}{name}" for name in ("clip_range", "clip_range_low", "clip_range_high")}
    present = {name: leaves[k] for name, k in keys.items() if k in leaves}
    for name, value in present.items():
        if not finite_number(value) or value < 0:
            problems.add(f"{keys[name]} {value!r} ({source}) is not a number >= 0", hint="e.g. 0.2")
            return set(keys.values()) & set(leaves)
    base = present.get("clip_range")
    if "clip_range" in present:
        if "clip_range_low" not in present:
            moved(keys["clip_range"], "actor.eps_clip", base, "")
        if "clip_range_high" not in present and "clip_range_low" in present:
            moved(keys["clip_range"], "actor.eps_clip_higher", base, " (the upper side: clip_range_high's default)")
        elif "clip_range_low" in present and "clip_range_high" in present:
            left(keys["clip_range"], "clip_range_low and clip_range_high, both set, win")
    if "clip_range_low" in present:
        moved(keys["clip_range_low"], "actor.eps_clip", present["clip_range_low"], "")
    if "clip_range_high" in present:
        moved(keys["clip_range_high"], "actor.eps_clip_higher", present["clip_range_high"], "")
    return set(keys.values()) & set(leaves)


def _sampling(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str) -> set[str]:
    """The taskset's rollout_args (top_p, top_k, max_tokens, n) and repeat_times, and buffer.train_batch_size."""
    args = f"{TASKSET}rollout_args."
    judged = {k for k in leaves if k in (f"{args}top_p", f"{args}top_k", f"{args}max_tokens", f"{args}n",
                                         f"{TASKSET}repeat_times", "buffer.train_batch_size")}
    for name, to in (("top_p", "gconfig.top_p"), ("top_k", "gconfig.top_k")):
        if f"{args}{name}" in leaves:
            moved(f"{args}{name}", to, leaves[f"{args}{name}"], "")
    if f"{args}max_tokens" in leaves:
        tokens, response = leaves[f"{args}max_tokens"], leaves.get("model.max_response_tokens")
        if response is not None and response != tokens:
            problems.add(f"{args}max_tokens {tokens!r} and model.max_response_tokens {response!r} ({source}) "
                         "disagree", hint="keep one (rlkit's gconfig.max_new_tokens)")
        elif response is not None:
            left(f"{args}max_tokens", "the same as model.max_response_tokens, moved")
        else:
            moved(f"{args}max_tokens", "gconfig.max_new_tokens", tokens, "")
    repeat = leaves.get("algorithm.repeat_times", 1)
    for key in (f"{args}n", f"{TASKSET}repeat_times"):
        if key not in leaves:
            continue
        if leaves[key] in (None, repeat):
            left(key, f"the same as algorithm.repeat_times ({repeat}), moved to gconfig.n_samples")
        else:
            problems.add(f"{key} {leaves[key]!r} and algorithm.repeat_times {repeat!r} ({source}) disagree on the "
                         "completions per task", hint="give it once, as algorithm.repeat_times (rlkit's "
                                                      "gconfig.n_samples)")
    if "buffer.train_batch_size" in leaves:
        size, batch = leaves["buffer.train_batch_size"], leaves.get("buffer.batch_size")
        if size is None or (finite_number(batch) and finite_number(repeat) and size == batch * repeat):
            left("buffer.train_batch_size", "batch_size x repeat_times: rlkit trains on every completion of a step")
        elif leaves.get("algorithm.sample_strategy_args.expert_data_ratio") is not None:
            left("buffer.train_batch_size", "read into expert_dataset.batch_size (expert_data_ratio of it)")
        else:
            problems.add(f"buffer.train_batch_size {size!r} ({source}) is not batch_size x repeat_times "
                         f"({batch!r} x {repeat!r}): rlkit trains on every completion of a step",
                         hint="remove it, or set buffer.batch_size to train_batch_size / repeat_times")
    return judged


def _prompts(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str) -> set[str]:
    """max_prompt_tokens and enable_prompt_truncation; the taskset's prompt_type, messages_key and tools_key."""
    judged: set[str] = set()
    tools = f"{TASKSET}format.tools_key"
    if tools in leaves:  # None: Trinity-RFT's task.get(None) finds no column, so no tools
        judged.add(tools)
        value = leaves[tools]
        if value is not None and not isinstance(value, str):
            problems.add(f"{tools} {value!r} ({source}) is not a column name", hint="e.g. tools")
        else:
            moved(tools, "train_dataset.tools_key", value or "", " (the row's tools, given to the chat template)"
                  if value else " (None: no tools column read)")
    tokens, truncate = f"{_MODEL}max_prompt_tokens", f"{_MODEL}enable_prompt_truncation"
    judged |= {k for k in (tokens, truncate) if k in leaves}
    if truncate in leaves:
        left(truncate, "rlkit drops prompts over train_dataset.max_length (counted in the trainer log), it "
                       "truncates none" if leaves[truncate] is not False else "false: prompts are kept whole")
    if tokens in leaves:
        if leaves.get(truncate, True) is False:
            left(tokens, "enable_prompt_truncation is false: no prompt is cut")
        else:
            moved(tokens, "train_dataset.max_length", leaves[tokens], " (rlkit drops longer prompts where "
                                                                      "Trinity-RFT truncates them)")
    kind, messages = f"{TASKSET}format.prompt_type", f"{TASKSET}format.messages_key"
    judged |= {k for k in (kind, messages) if k in leaves}
    if leaves.get(kind, "plaintext") not in ("plaintext", "messages"):
        problems.add(f"{kind} {leaves[kind]!r} ({source}): rlkit's RL prompts are plaintext or chat messages",
                     hint="plaintext (prompt_key) or messages (messages_key)")
    elif leaves.get(kind, "plaintext") == "messages":
        if f"{TASKSET}format.prompt_key" in leaves:
            problems.add(f"{kind} messages and {TASKSET}format.prompt_key ({source}): messages reads messages_key",
                         hint="remove prompt_key")
        moved(kind, "train_dataset.prompt_key", leaves.get(messages, "messages"),
              " (the messages column: rlkit's prompt column holds a string or chat messages)")
        if messages in leaves:
            left(messages, "moved with prompt_type messages")
    else:
        if kind in leaves:
            left(kind, "plaintext: rlkit's prompt column is read as it stands")
        if messages in leaves:
            left(messages, "prompt_type is plaintext: prompt_key is read")
    return judged

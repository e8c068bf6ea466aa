"""verl's optimizer, evaluation-sampling and off-policy keys whose value or default changes what a migrated run learns
(rlkit.config.verl.rules calls these before its generic rows). They once were "unknown" or silently rlkit's: AdamW's
betas and a warmup counted in steps were dropped, and a run that left its optimizer at verl's defaults (lr 1e-6,
weight_decay 0.01, betas (0.9, 0.999), no warmup, torch's eps 1e-8) trained with rlkit's (2e-5, 0.05, (0.9, 0.95),
0.001, 1e-5). Defaults: verl/trainer/config/optim/fsdp.yaml, actor/actor.yaml, critic/critic.yaml, rollout/rollout.yaml.

An unknown key under the sections that hold the algorithm's own knobs (LEARNING_SECTIONS) is refused: it is not
obviously infrastructure, and dropped it could change the loss; elsewhere an unknown key is named as unknown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.config.dotted import finite_number
from rlkit.config.verl.mapping import RunMapping, is_count, put

ARR = "actor_rollout_ref"
ACTOR, ROLLOUT = f"{ARR}.actor", f"{ARR}.rollout"
# (verl optim section, rlkit optimizer, verl's lr default, when it applies)
OPTIMS = ((f"{ACTOR}.optim", "actor.optimizer", 1e-6), ("critic.optim", "critic.optimizer", 1e-5))
OPTIM_DEFAULTS = {"weight_decay": ("weight_decay", 0.01), "lr_warmup_steps_ratio": ("warmup_steps_proportion", 0.0)}
VERL_BETAS, TORCH_EPS = (0.9, 0.999), 1e-8
LEARNING_SECTIONS = ("algorithm.", f"{ACTOR}.optim.", f"{ACTOR}.policy_loss.")
VAL = f"{ROLLOUT}.val_kwargs"
EVAL_TRIGGERS = ("evaluator.freq_steps", "evaluator.freq_epochs", "evaluator.freq_secs", "evaluator.eval_on_startup")


def optimizers(m: RunMapping) -> None:
    """The actor's optimizer (and the critic's, when the run trains one): betas, the warmup in steps, the newer
    lr_scheduler_type, clip_grad, the optimizer's kind, and verl's defaults where the run leaves them unset."""
    for section, ours, lr in OPTIMS:
        if section.startswith("critic") and not m.critic:
            continue
        optimizer(m, section, ours, lr)


def _default(m: RunMapping, key: str, to: str, value: Any, also: str = "") -> None:
    put(m.out, to, value)
    m.fate(key, f"moved to {to} as {value}, {m.whose} default{also}")


def optimizer(m: RunMapping, section: str, ours: str, lr: float) -> None:
    """One optimizer section (`section`, verl's names) as rlkit's `ours`, `lr` its default learning rate."""
    leaves = m.leaves
    if f"{section}.lr" not in leaves:
        _default(m, f"{section}.lr", f"{ours}.lr", lr)
    for name, (to, value) in OPTIM_DEFAULTS.items():
        steps: Any = leaves.get(f"{section}.lr_warmup_steps")
        if name == "lr_warmup_steps_ratio" and finite_number(steps) and steps > 0:
            continue  # the count is read (_warmup)
        if f"{section}.{name}" not in leaves:
            _default(m, f"{section}.{name}", f"{ours}.{to}", value)
    betas_key, betas = f"{section}.betas", leaves.get(f"{section}.betas", VERL_BETAS)
    if isinstance(betas, list | tuple) and len(betas) == 2 and all(finite_number(b) and 0 <= b < 1 for b in betas):
        put(m.out, f"{ours}.beta1", betas[0])
        put(m.out, f"{ours}.beta2", betas[1])
        put(m.out, f"{ours}.eps", TORCH_EPS)
        eps = f" (and {ours}.eps {TORCH_EPS}, torch AdamW's, which verl uses)"
        if betas_key in leaves:
            m.moved(betas_key, f"{ours}.beta1", betas[0], f" and {ours}.beta2 {betas[1]}{eps}")
        else:
            m.fate(betas_key, f"moved to {ours}.beta1 and beta2 as {betas[0]}, {betas[1]}, {m.whose} default{eps}")
    else:
        m.refuse(betas_key, "not two numbers in [0, 1)", "e.g. [0.9, 0.999]")
    _warmup(m, section, ours)
    style, kind = f"{section}.warmup_style", f"{section}.lr_scheduler_type"
    if kind in leaves:
        if leaves.get(style) is not None:
            m.left(kind, "warmup_style is set and wins, as in verl")
        elif leaves[kind] is not None:
            m.moved(kind, f"{ours}.lr_scheduler_type", leaves[kind])
    _decay_style(m, section, ours, style, kind)
    clip = f"{section}.clip_grad"
    grad_clip = f"{ACTOR}.grad_clip" if section.startswith(ARR) else "critic.grad_clip"
    if clip in leaves:
        if grad_clip in leaves and leaves[grad_clip] != leaves[clip]:
            m.refuse(clip, f"{grad_clip} says {leaves[grad_clip]!r}", "keep one (rlkit's "
                                                                     f"{ours}.gradient_clipping)")
        elif grad_clip in leaves:
            m.left(clip, f"the same as {grad_clip}, moved")
        else:
            m.moved(clip, f"{ours}.gradient_clipping", leaves[clip])
    for name, default, why in (("optimizer", "AdamW", "rlkit's adam is AdamW"),
                               ("optimizer_impl", "torch.optim", "torch's AdamW, as rlkit's"),
                               ("num_cycles", 0.5, "cosine's half cycle, as rlkit's")):
        key = f"{section}.{name}"
        if key in leaves:
            if leaves[key] in (default, None):
                m.left(key, why)
            else:
                m.refuse(key, "not built in rlkit", f"use {default}, verl's default")
    if f"{section}.total_training_steps" in leaves:
        m.left(f"{section}.total_training_steps", "verl fills it in at run time; rlkit's is total_train_steps")


def _decay_style(m: RunMapping, section: str, ours: str, *fsdp: str) -> None:
    """Megatron's lr_decay_style (verl's megatron optim config; constant its default): after the warmup it decays
    from lr to min_lr (0 unless set) by lr_decay_steps (the run's total unless set), as rlkit's lr_scheduler_type
    does to lr x min_lr_ratio (0) by the run's last step."""
    key = f"{section}.lr_decay_style"
    if key not in m.leaves:
        return
    value = m.leaves[key]
    if any(k in m.leaves for k in fsdp):
        m.refuse(key, f"{' and '.join(k for k in fsdp if k in m.leaves)} set(s) the schedule too", "keep one")
    elif value in (None, "constant"):
        m.moved(key, f"{ours}.lr_scheduler_type", "constant", " (megatron's lr_decay_style, verl's default)")
    elif value in ("linear", "cosine") and not {f"{section}.min_lr", f"{section}.lr_decay_steps"} & set(m.leaves):
        m.moved(key, f"{ours}.lr_scheduler_type", value, " (megatron's decay to lr 0 by the run's last step, as "
                                                          "rlkit's)")
    else:
        m.refuse(key, "not built in rlkit: rlkit decays constant, linear or cosine to lr x min_lr_ratio by the "
                      "run's last step", "use constant, linear or cosine (min_lr and lr_decay_steps unset)")


def _warmup(m: RunMapping, section: str, ours: str) -> None:
    """lr_warmup_steps (> 0: it wins over the ratio, as in verl) as its fraction of trainer.total_training_steps."""
    key, ratio = f"{section}.lr_warmup_steps", f"{section}.lr_warmup_steps_ratio"
    if key not in m.leaves:
        return
    steps, total = m.leaves[key], m.leaves.get("trainer.total_training_steps")
    if steps is None or (finite_number(steps) and steps <= 0):
        m.left(key, f"{steps}: off, lr_warmup_steps_ratio is read")
        return
    if ratio in m.leaves:
        m.left(ratio, "lr_warmup_steps is set and wins, as in verl")
    if is_count(steps) and is_count(total) and steps <= total:
        m.moved(key, f"{ours}.warmup_steps_proportion", steps / total, f" as {steps}/{total} of "
                                                                        "trainer.total_training_steps")
    elif total is None:  # verl: len(train_dataloader) * total_epochs (RayPPOTrainer._create_dataloader)
        m.refuse(key, "rlkit's warmup is a fraction of the run's steps, and trainer.total_training_steps is unset: "
                      "verl counts the total when it runs (the loaded rows' batches x trainer.total_epochs), as "
                      "rlkit's job counts its own after the prompt-length filter, so no fraction can be written here",
                 f"pass {ours}.warmup_steps_proportion={steps}/TOTAL as a number (TOTAL: the training rows // "
                 "data.train_batch_size x trainer.total_epochs), or set trainer.total_training_steps in the script",
                 unless=f"{ours}.warmup_steps_proportion")
    else:
        m.refuse(key, "rlkit's warmup is a fraction of the total steps, and the run's total "
                      "(trainer.total_training_steps) is not a number to divide by",
                 f"give it as lr_warmup_steps_ratio (warmup steps / total steps), or pass "
                 f"{ours}.warmup_steps_proportion=...", unless=f"{ours}.warmup_steps_proportion")


def validates(leaves: Mapping[str, Any]) -> bool:
    """Whether verl validates on data.val_files: before training unless trainer.val_before_train is false, and every
    trainer.test_freq steps when it is > 0 (RayPPOTrainer.fit); a test_freq rlkit cannot read is taken as on."""
    freq = leaves.get("trainer.test_freq", -1)
    off = freq is None or (finite_number(freq) and freq <= 0)
    return not off or leaves.get("trainer.val_before_train", True) is not False


def evaluation(m: RunMapping) -> None:
    """rollout.val_kwargs as eval_gconfig: verl validates greedily (do_sample false) unless told otherwise."""
    leaves = m.leaves
    keys = [k for k in leaves if k.startswith(f"{VAL}.")]
    if "data.val_files" not in leaves:
        for key in keys:
            m.left(key, "no data.val_files: no evaluation")
        return
    if not validates(leaves) and not set(EVAL_TRIGGERS) & set(m.overridden):
        why = (f"verl never validates this run: trainer.test_freq {leaves.get('trainer.test_freq', -1)} and "
               "trainer.val_before_train false (verl/trainer/ppo/ray_trainer.py fit)")
        if "valid_dataset.path" in m.overridden:
            m.refuse("data.val_files", f"{why}, so rlkit's evaluator is off and your valid_dataset.path would be "
                                       "ignored", "drop the valid_dataset.path override, or pass "
                                                  "evaluator.freq_steps=N to evaluate every N steps")
        else:
            m.left("data.val_files", why)
        for key in keys:
            m.left(key, "verl never validates this run")
        return
    sample = leaves.get(f"{VAL}.do_sample", False)
    if f"{VAL}.do_sample" in leaves:
        m.moved(f"{VAL}.do_sample", "eval_gconfig.greedy", not sample, f" as {not sample}")
    else:
        put(m.out, "eval_gconfig.greedy", True)
        m.fate(f"{VAL}.do_sample", "moved to eval_gconfig.greedy as true: verl validates greedily by default")
    for name in ("temperature", "top_p", "top_k"):
        key = f"{VAL}.{name}"
        if key in leaves and not sample:
            m.left(key, "do_sample is false: greedy, as in verl")
        elif key in leaves:
            m.moved(key, f"eval_gconfig.{name}", leaves[key])
    n = leaves.get(f"{VAL}.n", 1)
    if not sample and n != 1:
        put(m.out, "eval_gconfig.n_samples", 1)
        m.left(f"{VAL}.n", "do_sample is false: greedy gives one completion per prompt (verl's repeats are the same)")
    elif f"{VAL}.n" in leaves:
        m.moved(f"{VAL}.n", "eval_gconfig.n_samples", n)
    else:
        put(m.out, "eval_gconfig.n_samples", 1)
        m.fate(f"{VAL}.n", "moved to eval_gconfig.n_samples as 1, verl's default")


# (key, verl's default or off values, why rlkit cannot take another value, the fix)
NOT_BUILT: tuple[tuple[str, tuple[Any, ...], str, str], ...] = (
    ("algorithm.rollout_correction.rollout_is", (None, "null", False),
     "verl's rollout importance-sampling correction is not rlkit's", "leave it out; rlkit's off-policy guard is "
                                                                     "actor.rejection_sampling"),
    ("algorithm.rollout_correction.rollout_rs", (None, "null", False),
     "verl's rollout rejection sampling is not rlkit's", "leave it out; rlkit's is actor.rejection_sampling"),
    ("algorithm.use_pf_ppo", (False, None), "PF-PPO's reweighting of the batch by reward is not built",
     "set it false"),
    (f"{ROLLOUT}.multi_turn.enable", (False, None), "verl's multi-turn tool rollouts are not rlkit's",
     "write the tools as rollout.agent (docs: agents)"),
    (f"{ROLLOUT}.multi_turn.tool_config_path", (None, "null", ""), "verl's multi-turn tool rollouts are not "
     "rlkit's", "write the tools as rollout.agent (docs: agents)"),
    (f"{ROLLOUT}.over_sample_rate", (0, 0.0, None), "rlkit does not abort a step's slowest rollouts",
     "set it 0"),
    (f"{ROLLOUT}.ignore_eos", (False, None), "rlkit's completions end at EOS", "set it false"),
    (f"{ROLLOUT}.do_sample", (True, None), "a training rollout must sample", "set it true"),
    (f"{ARR}.model.lora_adapter_path", (None, "null", ""), "the adapter starts from a trained one: rlkit draws a "
                                                           "fresh adapter", "leave it out"),
    ("data.sampler.class_path", (None, "null"), "a sampler of verl's (a curriculum) orders the rows: rlkit reads "
                                                "them shuffled or in order (train_dataset.shuffle)", "leave it out"),
    ("data.custom_cls.path", (None, "null"), "a dataset class of verl's builds the rows: rlkit reads the file's",
     "write the rows it builds to a file and give that file"),
    ("data.tool_config_path", (None, "null", "", "${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path, "
                                                 "null}"), "verl puts the tools' schemas into every prompt "
                                                  "(verl/utils/dataset/rl_dataset.py RLHFDataset)",
     "write the tools as rollout.agent (docs: agents)"),
    # MoE router replay (verl/workers/actor/megatron_actor.py, megatron_workers.py): R2 replays in the training
    # forwards the experts the old-log-prob pass chose, R3 those the rollout engine chose
    (f"{ACTOR}.router_replay.mode", ("disabled", None), "verl's MoE router replay fixes each token's experts in the "
                                                        "training forwards to those chosen before (R2: the old "
                                                        "log-prob pass, R3: the rollout engine), which changes the "
                                                        "log-probs and gradients; rlkit's trainer routes each token by "
                                                        "the current router", "set it disabled"),
    # verl/trainer/ppo/ray_trainer.py fit: the actor updates only once trainer.critic_warmup <= global_steps
    ("trainer.critic_warmup", (0, None), "verl trains only the critic for the first critic_warmup steps, the actor "
                                         "after them; rlkit updates the actor from the first step", "set it 0"),
)
# sections any key of which changes the prompts or the model the run trains
NOT_BUILT_SECTIONS = (
    ("data.apply_chat_template_kwargs.", "the chat template's arguments change the prompts: rlkit renders the "
                                         "template with its defaults", "bake them into the model's chat template"),
    (f"{ARR}.model.override_config.", "overrides of the model's config.json: rlkit loads the model as its "
                                      "config.json says", "write them into a copy of the model directory's "
                                                          "config.json and give that path"),
)


def not_built(m: RunMapping) -> None:
    """Refuse the keys whose meaning rlkit has not built, unless verl's default (then left out, saying so)."""
    for key, defaults, why, fix in NOT_BUILT:
        if key in m.leaves:
            if m.leaves[key] in defaults:
                m.left(key, f"{m.leaves[key]}: verl's default, off")
            else:
                m.refuse(key, why, fix)
    for prefix, why, fix in NOT_BUILT_SECTIONS:
        for key in [k for k in m.leaves if k.startswith(prefix)]:
            m.refuse(key, why, fix)
    for prefix, switches in (("algorithm.rollout_correction.", NOT_BUILT[:2]), ("algorithm.pf_ppo.", NOT_BUILT[2:3]),
                             (f"{ROLLOUT}.multi_turn.", NOT_BUILT[3:5])):
        off = all(m.leaves.get(key) in defaults for key, defaults, _, _ in switches)
        for key in [k for k in m.leaves if k.startswith(prefix) and k not in m.done]:
            if off:
                m.left(key, f"{' and '.join(k for k, *_ in switches)} off: not read")
            else:
                m.done.add(key)  # its switch is refused, naming the fix


def filter_groups(m: RunMapping) -> None:
    """DAPO's dynamic sampling (algorithm.filter_groups): verl drops the groups whose metric is the same for every
    sample and generates more until the batch is full again; rlkit's actor.dynamic_sampling (AReaL's) drops them from
    the step's batch and trains on fewer. Close, not the same: refused unless the user's override says which."""
    prefix = "algorithm.filter_groups."
    keys = [k for k in m.leaves if k.startswith(prefix) and k not in m.done]
    if not keys:
        return
    if m.leaves.get(f"{prefix}enable") in (None, False):
        for key in keys:
            m.left(key, "filter_groups.enable is false, verl's default")
        return
    m.refuse(f"{prefix}enable", "verl's DAPO filter refills the batch with new groups until each has mixed rewards; "
                                "rlkit's actor.dynamic_sampling drops the flat groups and trains the step on fewer",
             "pass actor.dynamic_sampling=true to take rlkit's (the step's batch shrinks instead), or leave the "
             "filter out", unless="actor.dynamic_sampling")
    for key in keys:
        if key != f"{prefix}enable":
            m.left(key, "with algorithm.filter_groups.enable")


def unknown_changes_learning(key: str, critic: bool) -> bool:
    """Whether an unknown key lies where the algorithm's own knobs are (refused, not named as unknown); the
    critic's optimizer only in a run that trains a critic."""
    return key.startswith(LEARNING_SECTIONS) or (critic and key.startswith("critic.optim."))

"""verl's keys as rlkit's, for `rlkit migrate`: each key of the run moved (renamed), converted (its value or its
meaning changes name), left out with the key map's reason, refused with the fix, or named as unknown.

Names come from rlkit.config.verl.keys (the key map's rows); the conversions here are the rows whose value or meaning
differs. verl's defaults are written where the run relies on them and rlkit's differ (the algorithm, the KL loss's
coefficient, the GPU counts), each said in the header. verl colocates rollout and training on the same GPUs; rlkit
runs its servers and trainer on GPUs of their own, so the run's GPUs are split between them (rlkit.config.verl.layout).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from rlkit.config.names import MAX_NAME_LENGTH, RULE, check_name, name_like
from rlkit.config.trinity_terms import KL_ESTIMATORS
from rlkit.config.verl.data import set_reward
from rlkit.config.verl.estimators import VERL_KL_COEF, algorithm
from rlkit.config.verl.inputs import data_inputs
from rlkit.config.verl.keys import VERL_KEYS
from rlkit.config.verl.layout import allocation
from rlkit.config.verl.learning import (
    evaluation,
    filter_groups,
    not_built,
    optimizers,
    unknown_changes_learning,
)
from rlkit.config.verl.mapping import RunMapping, VerlKey, is_count, put
from rlkit.config.verl.overlong import reward_managers
from rlkit.config.verl.policy_loss import loss_mode
from rlkit.config.verl.reward_model import reward_model
from rlkit.errors import ConfigError

ARR = "actor_rollout_ref"
ACTOR, ROLLOUT = f"{ARR}.actor", f"{ARR}.rollout"
# verl's KL estimator names (core_algos.kl_penalty) -> rlkit's; the "+" (straight-through) forms, abs and full are not
# built
VERL_KL = {**KL_ESTIMATORS, "kl": "k1", "mse": "k2"}
VERL_TARGET_KL, VERL_HORIZON = 0.1, 10000  # verl's KLControlConfig defaults (verl/trainer/config/algorithm.py)
RESUME = {"auto": "auto", "disable": "disabled"}
LOGGERS = {"wandb": ("stats_logger.wandb.mode", "online"), "swanlab": ("stats_logger.swanlab.mode", "cloud")}
ROWS = {their: (ours, note) for their, ours, note in VERL_KEYS if not their.endswith(".*")}
# the rows of a whole section ("section.*"): every key under it
SECTION_ROWS = tuple((their[:-1], (ours, note)) for their, ours, note in VERL_KEYS if their.endswith(".*"))
# verl's defaults for the run's shape and names, written when the run leaves them unset (rlkit's differ or are
# required): verl/trainer/config/ppo_trainer.yaml
RUN_DEFAULTS = {"data.train_batch_size": 1024, "data.max_prompt_length": 512, "data.max_response_length": 512,
                "trainer.project_name": "verl_examples", "trainer.experiment_name": "gsm8k"}


def verl_row(key: str) -> tuple[str, str] | None:
    """The key map's (rlkit key or "", note) of verl's `key` (its own row, or its section's); None: unknown. Also how
    Trinity-RFT's embedded verl config is read (rlkit.config.trinity_verl)."""
    return ROWS.get(key) or next((row for prefix, row in SECTION_ROWS if key.startswith(prefix)), None)


def verl_to_rlkit(leaves: dict[str, Any], source: str, estimators: Mapping[str, str],
                  overridden: Collection[str] = (), *, whole_config: bool = False
                  ) -> tuple[dict[str, Any], list[VerlKey]]:
    """The rlkit mapping of a verl run's keys and the fate of each; ConfigErrors naming every key rlkit cannot take
    as it stands (each with its fix). `overridden`: the rlkit keys the user's overrides set (a refusal those fix is
    not one). `estimators`: verl's adv_estimator -> rlkit's job type (rlkit.jobs.REGISTRY.verl_estimators).
    `whole_config`: the keys come from a YAML file, which spells out verl's defaults as well as the run's choices."""
    m = RunMapping(leaves, source, overridden)
    m.whole_config = whole_config
    algorithm(m, estimators)
    optimizers(m)
    evaluation(m)
    not_built(m)
    filter_groups(m)
    data_inputs(m)
    reward_managers(m)
    reward_model(m)
    _kl(m)
    _batches(m)
    allocation(m)
    _special(m)
    _names(m)
    for key, value in leaves.items():
        if key in m.done:
            continue
        ours, note = verl_row(key) or (None, "")
        if ours is None and unknown_changes_learning(key, m.critic):
            m.refuse(key, "not a verl key rlkit's key map knows, in a section whose keys change what the run "
                          "learns", "remove it if it holds verl's default; otherwise check its spelling, or set "
                                    "the rlkit key it means yourself (rlkit explain KEY)")
        elif ours is None:
            m.fate(key, "unknown: not a verl key rlkit's key map knows; check its spelling, or set the rlkit key "
                        "it means yourself")
        elif not ours:
            m.left(key, note)
        elif value is None:
            m.left(key, "null: rlkit's default")
        else:
            m.moved(key, ours, value)
    m.problems.raise_if_any()
    return m.out, m.fates


def _kl(m: RunMapping) -> None:
    """The KL loss (actor.use_kl_loss) and the KL reward penalty (algorithm.use_kl_in_reward) with their
    coefficients and estimators: off in verl unless their switch is true."""
    for switch, coef, kind, to_coef, to_kind in (
            (f"{ACTOR}.use_kl_loss", f"{ACTOR}.kl_loss_coef", f"{ACTOR}.kl_loss_type", "actor.kl_loss_coef",
             "actor.kl_loss_type"),
            ("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_penalty", "actor.kl_ctl",
             "actor.kl_estimator")):
        on = m.leaves.get(switch, False)
        if not on:
            if switch in m.leaves:
                m.left(switch, f"false: rlkit's term is off unless {to_coef} > 0")
            for key in (coef, kind):
                if key in m.leaves:
                    m.left(key, f"{switch} is false")
            continue
        value = m.leaves.get(coef, VERL_KL_COEF)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            m.refuse(coef, "not a number >= 0", f"e.g. {coef}=0.001")
            continue
        name = m.leaves.get(kind, "low_var_kl" if "kl_loss" in kind else "kl")
        if not isinstance(name, str) or name not in VERL_KL:
            m.refuse(kind, "not one of rlkit's KL estimators (k1, k2, k3)",
                     f"use one of {', '.join(VERL_KL)} (rlkit's {to_kind})")
            continue
        m.moved(switch, to_coef, value, f" {value}" + ("" if coef in m.leaves else ", verl's default"))
        if coef in m.leaves:
            m.fate(coef, f"moved to {to_coef}")
        if value == 0:  # the term is off: its estimator would be refused as ignored (rlkit.checks.conditional_knobs)
            if kind in m.leaves:
                m.left(kind, f"{coef} is 0: the term is off")
            continue
        clamp = " (k3 clamped to [-10, 10], rlkit's actor.kl_clamp)" if name == "low_var_kl" else ""
        put(m.out, to_kind, VERL_KL[name])
        m.fate(kind, f"moved to {to_kind} as {VERL_KL[name]}{clamp}" + ("" if kind in m.leaves else
                                                                        f" ({name}, verl's default)"))
    _kl_controller(m)


def _kl_controller(m: RunMapping) -> None:
    """algorithm.kl_ctrl.type adaptive (with target_kl and horizon) as actor.kl_ctl_adaptive: verl adapts the KL
    reward penalty's coefficient only when that penalty is on (use_kl_in_reward) and its kl_coef is not 0."""
    ctrl, target, horizon = (f"algorithm.kl_ctrl.{name}" for name in ("type", "target_kl", "horizon"))
    kind = m.leaves.get(ctrl, "fixed")
    if kind not in ("fixed", "adaptive"):
        m.refuse(ctrl, "not one of verl's KL controllers (fixed, adaptive)", f"set {ctrl}=fixed or adaptive")
        return
    kl_ctl = m.out.get("actor", {}).get("kl_ctl")
    why = ("the adaptive controller's; algorithm.kl_ctrl.type is fixed" if kind == "fixed" else
           "algorithm.use_kl_in_reward is false: no KL reward penalty to adapt"
           if not m.leaves.get("algorithm.use_kl_in_reward", False) else
           "algorithm.kl_ctrl.kl_coef is 0: the controller multiplies it, so the penalty stays off" if kl_ctl == 0
           else "")
    if kl_ctl is None and not why:
        return  # the KL reward's coefficient was refused: its problem says what to fix
    if why:
        for key in (ctrl, target, horizon):
            if key in m.leaves:
                m.left(key, "fixed: actor.kl_ctl is the coefficient throughout" if key == ctrl and kind == "fixed"
                       else why)
        return
    values = {"target_kl": m.leaves.get(target, VERL_TARGET_KL), "horizon": m.leaves.get(horizon, VERL_HORIZON)}
    number_ok = {"target_kl": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and
                 math.isfinite(v) and v > 0,
                 "horizon": is_count}
    bad = [name for name, v in values.items() if not number_ok[name](v)]
    for name in bad:
        m.refuse(f"algorithm.kl_ctrl.{name}", "not a number > 0" if name == "target_kl" else "not a whole number > 0",
                 f"e.g. algorithm.kl_ctrl.{name}={VERL_TARGET_KL if name == 'target_kl' else VERL_HORIZON}")
    if bad:
        return
    defaults = [f"{name} {v}, verl's default" for name, v in values.items() if f"algorithm.kl_ctrl.{name}" not in
                m.leaves]
    m.moved(ctrl, "actor.kl_ctl_adaptive", values, " (actor.kl_ctl its starting coefficient" +
            "".join(f"; {d}" for d in defaults) + ")")
    for name in values:
        if f"algorithm.kl_ctrl.{name}" in m.leaves:
            m.fate(f"algorithm.kl_ctrl.{name}", f"moved to actor.kl_ctl_adaptive.{name}")


def _batches(m: RunMapping) -> None:
    """ppo_mini_batch_size (a size, in prompts) as ppo_n_minibatches (a count): train_batch_size / mini."""
    batch = m.leaves.get("data.train_batch_size", 1024)  # verl's default
    actor_key = f"{ACTOR}.ppo_mini_batch_size"
    for key, to in ((actor_key, "actor.ppo_n_minibatches"), ("critic.ppo_mini_batch_size", "critic.ppo_n_minibatches")):
        if key not in m.leaves:
            continue
        mini = m.leaves[key]
        if not is_count(batch) or not is_count(mini):
            m.left(key, f"data.train_batch_size / {key} is not a count here; set {to}")
        elif batch % mini:
            m.refuse(key, f"data.train_batch_size {batch} is not a multiple of it: rlkit splits a step's batch "
                          "into equal minibatches", f"make it divide {batch} (e.g. {_divisor(batch, mini)}), or "
                          f"pass {to}=N", unless=to)
        else:
            m.moved(key, to, batch // mini, f" {batch // mini} (train_batch_size {batch} / {mini})")
    if actor_key in m.done and "critic.ppo_mini_batch_size" not in m.leaves and \
            m.critic and "actor" in m.out and "ppo_n_minibatches" in m.out["actor"]:
        put(m.out, "critic.ppo_n_minibatches", m.out["actor"]["ppo_n_minibatches"])  # verl's critic takes the actor's
    micro = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    if micro in m.leaves:
        m.left(micro, ROWS[micro][1])


def _divisor(batch: int, near: int) -> int:
    return min((d for d in range(1, batch + 1) if batch % d == 0), key=lambda d: (abs(d - near), d))


def _special(m: RunMapping) -> None:
    """The keys whose value changes: LoRA's rank, the loss mode, data files, the reward, the triggers, loggers."""
    leaves = m.leaves
    if f"{ACTOR}.clip_ratio" in leaves and f"{ACTOR}.clip_ratio_low" in leaves:
        m.left(f"{ACTOR}.clip_ratio", "clip_ratio_low is set, and wins, as in verl")
    lora = f"{ARR}.model.lora_rank"
    if lora in leaves and is_count(leaves[lora]):
        put(m.out, "actor.use_lora", True)
        m.moved(lora, "actor.lora_rank", leaves[lora], " (and actor.use_lora: true)")
        modules = leaves.get(f"{ARR}.model.target_modules")
        if isinstance(modules, str):  # verl's default all-linear, or names joined by commas; rlkit's field is a list
            names = [name.strip() for name in modules.split(",") if name.strip()]
            m.moved(f"{ARR}.model.target_modules", "actor.target_modules", names, " (a list, as rlkit writes it)")
    else:  # LoRA off: its other knobs would be refused as ignored (rlkit.checks.conditional_knobs)
        if lora in leaves:
            m.left(lora, "0: LoRA off, rlkit's default")
        for key in (f"{ARR}.model.lora_alpha", f"{ARR}.model.target_modules"):
            if key in leaves:
                m.left(key, f"LoRA is off ({lora} 0)")
    loss_mode(m)  # the loss mode and the clip keys its loss does not read
    for key, to in (("data.train_files", "train_dataset.path"), ("data.val_files", "valid_dataset.path")):
        files = leaves.get(key)
        if isinstance(files, list) and key not in m.done:  # val_files: done when verl never validates (evaluation)
            if len(files) == 1:
                m.moved(key, to, files[0], " (its one file)")
            else:
                m.refuse(key, f"{len(files)} files: rlkit reads one file per dataset",
                         f"combine them into one file and name it, or pass {to}=FILE", unless=to)
    reward = "custom_reward_function.path"
    if leaves.get(reward):
        m.refuse(reward, "verl calls compute_score(data_source, solution_str, ground_truth, extra_info); rlkit calls "
                         "fn(prompt, completion, row)", "write fn(prompt, completion, row) calling your function and "
                                                        "pass reward.fn=/path/file.py:fn", unless="reward.fn")
    if "custom_reward_function.name" in leaves:  # verl reads the name only with a path (get_custom_reward_fn)
        m.left("custom_reward_function.name", "with custom_reward_function.path" if leaves.get(reward) else
               "custom_reward_function.path is unset: verl's default scorer")
    set_reward(m.out, leaves, m.overridden)  # verl's rows' nested answer, its default scorer's match: data_notes
    for key, to in (("trainer.save_freq", "recover.freq_steps"), ("trainer.test_freq", "evaluator.freq_steps"),
                    ("trainer.total_training_steps", "total_train_steps")):
        if key in leaves and (leaves[key] is None or (isinstance(leaves[key], int) and leaves[key] <= 0)):
            m.left(key, f"{leaves[key]}: off, rlkit's default for {to}")
    resume = "trainer.resume_mode"
    if resume in leaves:
        if leaves[resume] in RESUME:
            m.moved(resume, "recover.mode", RESUME[leaves[resume]], f" as {RESUME[leaves[resume]]}")
        else:
            m.refuse(resume, "rlkit resumes a trial by its name, not from a path",
                     "use auto or disable, and `rlkit resume TRIAL` to resume")
    if "data.val_files" in leaves and "trainer.val_before_train" not in leaves:
        put(m.out, "evaluator.eval_on_startup", True)  # verl validates before training unless told not to
        m.fate("trainer.val_before_train", "moved to evaluator.eval_on_startup as true, verl's default")
    _loggers(m)
    for key, default in RUN_DEFAULTS.items():  # the run's shape as verl would run it (rlkit's defaults differ)
        if key not in leaves:
            put(m.out, ROWS[key][0], default)
            m.fate(key, f"moved to {ROWS[key][0]} as {default}, verl's default")


def _names(m: RunMapping) -> None:
    """verl's project and experiment names as rlkit's experiment and trial names, which name directories and Slurm
    jobs: a name rlkit does not allow (verl's own example run_qwen3_4b_grpo_vllm_1k_npu.sh writes
    "qwen3_4b_grpo_8npu}", a `}` bash keeps) refused naming verl's key and an allowed name to pass."""
    for key, ours in (("trainer.project_name", "experiment_name"), ("trainer.experiment_name", "trial_name")):
        value = m.leaves.get(key)
        if not isinstance(value, str):
            continue
        try:
            check_name(ours, value)
        except ConfigError:
            near = name_like(value) or ("math-grpo" if ours == "experiment_name" else "run_1")
            unread = ": a shell variable rlkit left unexpanded" if "$" in value else ""
            m.refuse(key, f"rlkit's {ours} takes {RULE}, at most {MAX_NAME_LENGTH} characters{unread}",
                     f"pass {ours}={near} (or another allowed name)", unless=ours)


def _loggers(m: RunMapping) -> None:
    key = "trainer.logger"
    if key not in m.leaves:
        return
    value = m.leaves[key]
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else [str(value)]
    said = []
    for name in names:
        if name in LOGGERS:
            to, mode = LOGGERS[name]
            put(m.out, to, mode)
            said.append(f"{name}: {to} {mode}")
        elif name == "console":
            said.append("console: rlkit's log")
        elif name == "tensorboard":
            said.append("tensorboard: set stats_logger.tensorboard.path")
        else:
            said.append(f"{name}: no rlkit sink (metrics.jsonl is always written)")
    m.fate(key, "; ".join(said))

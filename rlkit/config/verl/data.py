"""A verl run's data and default reward as rlkit reads them, for `rlkit migrate`: the reference answer where verl's
preprocessing puts it, and which rlkit built-in scores as verl's default scorer does, said in the header.

verl's examples/data_preprocess scripts (gsm8k.py, math_dataset.py, ...) write rows `{data_source, prompt: [chat
messages], ability, reward_model: {style: rule, ground_truth}, extra_info}`, and verl's reward reads
`row["reward_model"]["ground_truth"]` (no verl key names it), so the migrated run reads it there:
`reward.answer_key: reward_model.ground_truth` (rlkit.data.row_field). verl's default scorer
(verl/utils/reward_score default_compute_score) is chosen by the row's data_source; for GSM8K and the MATH sets it
compares the final answer with the ground truth, as rlkit's built-in `math` does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from rlkit.config.verl.mapping import put

VERL_ANSWER_KEY = "reward_model.ground_truth"
CUSTOM_REWARD = "custom_reward_function.path"
MODEL_REWARD = "reward_model.enable"
# verl's default_compute_score: data_source -> how it scores (the sources rlkit's `math` scores alike)
GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def _reward_overridden(overridden: Collection[str]) -> bool:
    return bool({"reward.fn", "reward.fns"} & set(overridden))


def set_reward(out: dict[str, Any], leaves: Mapping[str, Any], overridden: Collection[str]) -> None:
    """verl's answer field as reward.answer_key, and `math` as reward.fn where the run keeps verl's default scorer
    (no custom_reward_function.path); the user's overrides of either stand."""
    if "reward.answer_key" not in overridden:
        put(out, "reward.answer_key", VERL_ANSWER_KEY)
    if not leaves.get(CUSTOM_REWARD) and not _reward_overridden(overridden) and leaves.get(MODEL_REWARD) is not True:
        put(out, "reward.fn", "math")  # a reward model's run: rlkit.config.verl.reward_model


def data_notes(leaves: Mapping[str, Any], overridden: Collection[str]) -> list[str]:
    """The header's lines on the run's data and reward: what set_reward wrote, and why."""
    if "reward.answer_key" in overridden:
        lines = ["Your data: your reward.answer_key override names the reference answer of each row."]
    else:
        lines = [f"Your data: reward.answer_key is {VERL_ANSWER_KEY}: verl's preprocessing scripts "
                 "(examples/data_preprocess/gsm8k.py, math_dataset.py) nest each row's reference answer there "
                 "(reward_model: {style: rule, ground_truth: ...}), where verl's reward reads it. rlkit reads the "
                 "rows as they are, each prompt (a list of chat messages) through the model's chat template with the "
                 "generation prompt, as verl does. Rows of another shape: pass reward.answer_key=COLUMN."]
    if leaves.get(CUSTOM_REWARD):
        return lines  # its fate says what became of it
    if _reward_overridden(overridden):
        return [*lines, "The reward: your reward.fn override scores the completions (not verl's "
                        "default_compute_score)."]
    if leaves.get(MODEL_REWARD) is True:
        return [*lines, "The reward: reward.fn reward_model, the score of reward.reward_model_path (verl's "
                        "reward_model.model.path) alone, as verl's training reward is with reward_model.enable (its "
                        "rule-based scorer is not added); rlkit renders each conversation through the reward model's "
                        "own chat template, as verl's reward loop does. Evaluation differs: verl validates with its "
                        "rule-based scorer (val_reward_fn, by data_source; none at all for rows of style model) "
                        "unless the reward loop scored the model on a pool of its own; rlkit's evaluator scores "
                        "with reward.fn, so its eval metrics are the model's scores."]
    return [*lines,
            "The reward: reward.fn math. verl's default_compute_score picks its scorer by each row's data_source; "
            f"for {', '.join(GSM8K_SOURCES)} (the number after '#### ', compared as text) and "
            f"{', '.join(MATH_SOURCES)} (the last \\boxed{{}}, compared after normalising) rlkit's math scores alike, "
            "1.0 or 0.0: the last \\boxed{} or else the last number, compared with math-verify, so it also credits "
            "a right answer written without verl's '#### ' (verl's strict GSM8K check scores that 0). Other "
            "data_sources (math_dapo and aime: +1/-1 from an 'Answer:' line; code: a sandbox) need a reward.fn of "
            "your own: fn(prompt, completion, row), the row holding data_source, reward_model and extra_info."]

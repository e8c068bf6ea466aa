"""The sections of the two preference-pair job types: `rw` (a reward model) and `dpo` (direct preference
optimisation). Both read pairs from `train_dataset`: a prompt and a chosen and a rejected answer per row.

Names follow the seeds: the pair columns are Trinity-RFT's `chosen_key`/`rejected_key` (the prompt column stays
`train_dataset.prompt_key`); `beta` and `loss_type` are AReaL's DPO knobs (its only two, on its DPO engine config)
and Trinity-RFT's; `label_smoothing` is not AReaL's: it is Trinity-RFT's and TRL's (conservative DPO, the formula of
Trinity-RFT's `dpo` policy loss and TRL 0.28's sigmoid loss), 0 gives AReaL's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f

DPO_LOSS_TYPES = ("sigmoid",)


@dataclass
class PairDataConfig:
    """Which columns of a dataset row hold the preferred and the dispreferred answer, and what overlong rows become."""

    chosen_key: str = _f("chosen", "Column with the preferred answer: a string, or chat messages (the assistant "
                                   "turn(s) after the prompt's messages), the same kind as the prompt.")
    rejected_key: str = _f("rejected", "Column with the dispreferred answer, the same kind as chosen_key.")
    truncate_prompt: bool = _f(False, "A pair longer than train_dataset.max_length tokens (prompt + longer answer): "
                                      "false drops the row; true cuts the prompt's oldest tokens so that both answers "
                                      "fit (a row whose answer alone is too long is dropped either way).")


@dataclass
class RWConfig(PairDataConfig):
    """Job type rw: a scalar-head reward model trained so that chosen answers score above rejected ones (pairwise
    loss -log sigmoid(r_chosen - r_rejected)); the trained model and its tokenizer are saved for scoring."""


@dataclass
class DPOConfig(PairDataConfig):
    """Job type dpo: the actor learns from chosen/rejected pairs directly, against a frozen reference model."""

    beta: float = _f(0.1, "Strength of the pull towards the reference model: the DPO loss is "
                          "-log sigmoid(beta * ((chosen - ref chosen) - (rejected - ref rejected))) of summed "
                          "answer log-probs; typical 0.05..0.5.")
    loss_type: str = _f("sigmoid", "DPO loss variant. Choices: sigmoid (the original DPO loss).")
    label_smoothing: float = _f(0.0, "Assumed fraction of flipped preference labels (conservative DPO, "
                                     "Trinity-RFT's and TRL's knob; AReaL has none), in [0, 0.5); 0: the original "
                                     "loss, AReaL's.")
    ref_path: str = _f("", "Hugging Face directory of the frozen reference model, dpo's own name of ref.path (set "
                           "one of them); empty: ref.path, else actor.path (the usual choice: the model DPO starts "
                           "from). Its answer log-probs are computed once per pair.")

"""`reward.fn: reward_model`: completions scored by a reward model trained with job type rw (its checkpoints/final,
named by `reward.reward_model_path`, AReaL's field name).

The score is what rw trained: the value head's output at the last token of prompt + completion + end of sequence,
tokenized as rw tokenizes a text pair (rlkit.data.answer_tokens), so the model reads sequences shaped like the ones it
learned to rank. Only differences between scores mean something (the pairwise loss ignores any constant offset), so
a GRPO run uses them through group normalisation (actor.reward_norm) or shifts them with reward_bias/reward_scaling.

It runs inside RewardRunner's worker process on trainer rank 0, on the CPU: `warmup` loads the model once per worker
(not charged to a call's time limit) and every call is one forward pass. torch is imported only there: the login
node resolves this function without loading it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

REWARD_MODEL = "reward_model"  # the reward.fn name
_loaded: dict[str, tuple[Any, Any]] = {}


def _model(path: str) -> tuple[Any, Any]:
    """The reward model and its tokenizer, loaded once per process."""
    if path not in _loaded:
        from transformers import AutoTokenizer

        from rlkit.models.value_model import load_value_model

        model = load_value_model(path).eval()
        model.requires_grad_(False)
        _loaded[path] = (model, AutoTokenizer.from_pretrained(path))
    return _loaded[path]


def reward_model_score(prompt: str, completion: str, row: dict[str, Any], *, model_path: str) -> float:
    """The reward model's score of `completion` after `prompt` (the row is not read)."""
    import torch

    from rlkit.data.answer_tokens import answer_ids, prompt_ids
    from rlkit.models.value_model import last_token_scores, token_values

    model, tokenizer = _model(model_path)
    head = prompt_ids(tokenizer, prompt)
    ids = head + answer_ids(tokenizer, prompt, completion, head)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        values = token_values(model, input_ids, torch.ones_like(input_ids))
    return float(last_token_scores(values, torch.tensor([len(ids) - 1]))[0])


def make_reward_model_reward(model_path: str) -> partial[float]:
    """`reward_model_score` bound to the model; its `warmup` loads the model in the worker before the first call."""
    fn = partial(reward_model_score, model_path=model_path)
    fn.warmup = partial(_model, model_path)  # type: ignore[attr-defined]
    return fn

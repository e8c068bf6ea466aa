"""`reward.fn: reward_model`: completions scored by a reward model trained with job type rw (its checkpoints/final,
named by `reward.reward_model_path`, AReaL's field name).

The score is what rw trained: the value head's output at the last token of prompt + completion + end of sequence,
tokenized as rw tokenizes a text pair (rlkit.data.answer_tokens), so the model reads sequences shaped like the ones it
learned to rank. Only differences between scores mean something (the pairwise loss ignores any constant offset), so
a GRPO run uses them through group normalisation (actor.reward_norm) or shifts them with reward_bias/reward_scaling.

Where it runs: with `reward.reward_model_engine_num` > 0, on the reward model's own vLLM servers (a pooling runner,
started as an auxiliary model's: rlkit.config.served_models): the worker tokenizes as below, sends the ids, and takes
the value at the last token; the servers compute what `token_values` computes here (checked against it). Otherwise
inside RewardRunner's worker process on trainer rank 0, on the CPU: `warmup` loads the model once per worker (not
charged to a call's time limit) and every call is one forward pass. torch is imported only there: the login node
resolves this function without loading it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from rlkit.config.served_models import REWARD_MODEL

__all__ = ["REWARD_MODEL", "make_reward_model_reward", "reward_model_score", "served_reward_model_score"]
_loaded: dict[str, tuple[Any, Any]] = {}
_tokenizers: dict[str, Any] = {}


def _model(path: str) -> tuple[Any, Any]:
    """The reward model and its tokenizer, loaded once per process."""
    if path not in _loaded:
        from transformers import AutoTokenizer

        from rlkit.models.value_model import load_value_model

        model = load_value_model(path).eval()
        model.requires_grad_(False)
        _loaded[path] = (model, AutoTokenizer.from_pretrained(path))
    return _loaded[path]


def _tokenizer(path: str) -> Any:
    """The reward model's tokenizer, loaded once per process (the served path loads no model)."""
    if path not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[path] = AutoTokenizer.from_pretrained(path)
    return _tokenizers[path]


def _scored_ids(tokenizer: Any, prompt: str, completion: str) -> list[int]:
    """prompt + completion + end of sequence, tokenized as rw tokenizes a text pair."""
    from rlkit.data.answer_tokens import answer_ids, prompt_ids

    head = prompt_ids(tokenizer, prompt)
    return head + answer_ids(tokenizer, prompt, completion, head)


def reward_model_score(prompt: str, completion: str, row: dict[str, Any], *, model_path: str) -> float:
    """The reward model's score of `completion` after `prompt` (the row is not read)."""
    import torch

    from rlkit.models.value_model import last_token_scores, token_values

    model, tokenizer = _model(model_path)
    ids = _scored_ids(tokenizer, prompt, completion)
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        values = token_values(model, input_ids, torch.ones_like(input_ids))
    return float(last_token_scores(values, torch.tensor([len(ids) - 1]))[0])


def served_reward_model_score(prompt: str, completion: str, row: dict[str, Any], *, model_path: str) -> float:
    """The score of `completion` after `prompt` from the reward model's servers: the value at the last token."""
    from rlkit.rewards.auxiliary import auxiliary_model

    ids = _scored_ids(_tokenizer(model_path), prompt, completion)
    return auxiliary_model(REWARD_MODEL).token_scores(ids)[-1]


def _served_warmup(model_path: str) -> None:
    """Load the tokenizer and find a live server of the reward model before the first call."""
    from rlkit.rewards.auxiliary import auxiliary_model

    _tokenizer(model_path)
    auxiliary_model(REWARD_MODEL).warmup()


def make_reward_model_reward(model_path: str, *, served: bool = False) -> partial[float]:
    """The reward model's score bound to its model: with `served`, asked of its servers (warmup: the tokenizer and a
    live server), else computed here (warmup: the model loaded in the worker before the first call)."""
    if served:
        fn = partial(served_reward_model_score, model_path=model_path)
        fn.warmup = partial(_served_warmup, model_path)  # type: ignore[attr-defined]
        return fn
    fn = partial(reward_model_score, model_path=model_path)
    fn.warmup = partial(_model, model_path)  # type: ignore[attr-defined]
    return fn

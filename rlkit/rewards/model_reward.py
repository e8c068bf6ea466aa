"""`reward.fn: reward_model`: completions scored by a reward model (`reward.reward_model_path`, AReaL's field name):
one trained with job type rw (its checkpoints/final), or one trained elsewhere in Hugging Face's sequence-classifier
form (`*ForSequenceClassification`, one label: Skywork-Reward and the like; rlkit.config.model_config
.reward_model_format tells them apart).

What each reads, so it sees sequences shaped like the ones it learned to rank:
- rw's: prompt + completion + end of sequence, tokenized as rw tokenizes a text pair (rlkit.data.answer_tokens); the
  score is the value head's output at the last token;
- a sequence classifier: the conversation through its own tokenizer's chat template (the row's prompt messages, or
  the prompt text as a user message, then the completion as the assistant's), or prompt + completion as text when
  it has no template; the score is its logit at the last token (read there, not where transformers' class looks for
  the first pad token, which is wrong for a model whose end of sequence is its pad token); an encoder classifier
  (BERT, DeBERTa: no `score` head) scores as its own forward pools (its first token), as vLLM's classify does.
Only differences between scores mean something (a pairwise loss ignores any constant offset), so a GRPO run uses
them through group normalisation (actor.reward_norm) or shifts them with reward_bias/reward_scaling.

Where it runs: with `reward.reward_model_engine_num` > 0, on the reward model's own vLLM servers (a pooling runner,
started as an auxiliary model's: rlkit.config.served_models): the worker tokenizes as above and sends the ids; the
servers compute what is computed here (checked against it). Otherwise inside RewardRunner's worker process on
trainer rank 0, on the CPU: `warmup` loads the model once per worker (not charged to a call's time limit) and every
call is one forward pass. torch is imported only there: the login node resolves this function without loading it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from rlkit.config.model_config import SEQUENCE_CLASSIFIER, VALUE_HEAD
from rlkit.config.model_config import reward_model_format as _read_format
from rlkit.config.served_models import REWARD_MODEL

__all__ = ["REWARD_MODEL", "make_reward_model_reward", "reward_model_score", "served_reward_model_score"]
_loaded: dict[str, Any] = {}
_tokenizers: dict[str, Any] = {}
# the pooling task of each form on vLLM's /pooling route (rlkit.servers.vllm.backend.VllmBackend.pooling)
_TASKS = {VALUE_HEAD: "token_classify", SEQUENCE_CLASSIFIER: "classify"}
_forms: dict[str, str] = {}


def reward_model_format(path: str) -> str:
    """The reward model's form (rlkit.config.model_config.reward_model_format), read from the shared filesystem
    once per process: it cannot change during a run, and every call asks."""
    if path not in _forms:
        _forms[path] = _read_format(path)
    return _forms[path]


def _tokenizer(path: str) -> Any:
    """The reward model's tokenizer, loaded once per process."""
    if path not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[path] = AutoTokenizer.from_pretrained(path)
    return _tokenizers[path]


def _model(path: str) -> Any:
    """The reward model (and its tokenizer), loaded once per process, in float32, without gradients."""
    if path not in _loaded:
        import torch

        if reward_model_format(path) == SEQUENCE_CLASSIFIER:
            from transformers import AutoModelForSequenceClassification

            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        else:
            from rlkit.models.value_model import load_value_model

            model = load_value_model(path)
        model.eval().requires_grad_(False)
        _loaded[path] = model
        _tokenizer(path)
    return _loaded[path]


def scored_ids(path: str, prompt: str, completion: str, row: dict[str, Any], prompt_key: str) -> list[int]:
    """The tokens the reward model in `path` reads for `completion` after `prompt` (this module's docstring)."""
    from rlkit.data.answer_tokens import answer_ids, prompt_ids

    tokenizer = _tokenizer(path)
    if reward_model_format(path) != SEQUENCE_CLASSIFIER:
        head = prompt_ids(tokenizer, prompt)
        return head + answer_ids(tokenizer, prompt, completion, head)
    if not getattr(tokenizer, "chat_template", None):
        return [int(t) for t in tokenizer.encode(prompt + completion, add_special_tokens=True)]
    from rlkit.data.answer_tokens import chat_ids
    from rlkit.data.row_formats import rl_prompt

    try:
        asked = rl_prompt(row, prompt_key)
    except KeyError:
        asked = prompt
    messages = list(asked) if isinstance(asked, list) else [{"role": "user", "content": prompt}]
    return chat_ids(tokenizer, [*messages, {"role": "assistant", "content": completion}], generation_prompt=False)


def reward_model_score(prompt: str, completion: str, row: dict[str, Any], *, model_path: str,
                       prompt_key: str = "prompt") -> float:
    """The reward model's score of `completion` after `prompt`, computed here."""
    import torch

    model = _model(model_path)
    ids = torch.tensor([scored_ids(model_path, prompt, completion, row, prompt_key)])
    with torch.no_grad():
        if reward_model_format(model_path) == SEQUENCE_CLASSIFIER:
            if not isinstance(getattr(model, "score", None), torch.nn.Module):  # an encoder (BERT, DeBERTa): its
                return float(model(input_ids=ids).logits.float()[0, 0])  # own pooling (the first token) and head
            hidden = model.base_model(input_ids=ids).last_hidden_state
            return float(model.score(hidden[:, -1]).float()[0, 0])
        from rlkit.models.value_model import last_token_scores, token_values

        values = token_values(model, ids, torch.ones_like(ids))
    return float(last_token_scores(values, torch.tensor([ids.shape[1] - 1]))[0])


def served_reward_model_score(prompt: str, completion: str, row: dict[str, Any], *, model_path: str,
                              prompt_key: str = "prompt") -> float:
    """The score of `completion` after `prompt` from the reward model's servers."""
    from rlkit.rewards.auxiliary import auxiliary_model

    form = reward_model_format(model_path)
    ids = scored_ids(model_path, prompt, completion, row, prompt_key)
    values = auxiliary_model(REWARD_MODEL).pooling(ids, _TASKS.get(form, "token_classify"))
    if form != SEQUENCE_CLASSIFIER and len(values) != len(ids):  # one value per token: the last one is the score
        raise ValueError(f"the reward model's server scored {len(values)} tokens of {len(ids)}")
    return float(values[-1])


def _served_warmup(model_path: str) -> None:
    """Load the tokenizer and find a live server of the reward model before the first call."""
    from rlkit.rewards.auxiliary import auxiliary_model

    _tokenizer(model_path)
    auxiliary_model(REWARD_MODEL).warmup()


def make_reward_model_reward(model_path: str, *, served: bool = False, prompt_key: str = "prompt") -> partial[float]:
    """The reward model's score bound to its model and the rows' prompt column: with `served`, asked of its servers
    (warmup: the tokenizer and a live server), else computed here (warmup: the model loaded in the worker before
    the first call)."""
    if served:
        fn = partial(served_reward_model_score, model_path=model_path, prompt_key=prompt_key)
        fn.warmup = partial(_served_warmup, model_path)  # type: ignore[attr-defined]
        return fn
    fn = partial(reward_model_score, model_path=model_path, prompt_key=prompt_key)
    fn.warmup = partial(_model, model_path)  # type: ignore[attr-defined]
    return fn

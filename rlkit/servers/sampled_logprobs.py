"""What the log-probs a backend returns with sampled tokens mean: the model's raw distribution or the sampling one.

The trainer reproduces them to compare (rlkit.train.mismatch) and the PPO loss uses them as the behaviour policy, so
the meaning must be known per backend. To fold into `ServerBackend` as a class attribute when the backends move
behind it (the same values).

- vLLM 0.32 (`vllm/config/model.py` `ModelConfig.logprobs_mode`, `vllm/v1/sample/sampler.py`): the default
  `--logprobs-mode raw_logprobs` returns log_softmax of the logits before temperature, penalties and top-p/top-k;
  `processed_logprobs` returns them after all of those (temperature-scaled, truncated and renormalised).
- SGLang (`python/sglang/srt/layers/sampler.py`): log-probs of the temperature-scaled distribution unless the server
  runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1 (then raw).
"""

from __future__ import annotations

from typing import Literal

LogprobMeaning = Literal["raw", "temperature"]

# what each backend returns as rlkit starts it today (no --logprobs-mode, no SGLANG_RETURN_ORIGINAL_LOGPROB)
SAMPLED_LOGPROBS: dict[str, LogprobMeaning] = {"vllm": "raw", "sglang": "temperature"}


def sampled_logprobs_scaled(backend: str) -> bool:
    """Whether `backend`'s sampled-token log-probs are taken after the sampling temperature (True) or raw (False)."""
    try:
        return SAMPLED_LOGPROBS[backend] == "temperature"
    except KeyError:
        raise ValueError(f"unknown server backend {backend!r}; known: {', '.join(SAMPLED_LOGPROBS)}") from None

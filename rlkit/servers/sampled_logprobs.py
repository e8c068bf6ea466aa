"""What the log-probs a server returns with sampled tokens mean: the model's raw distribution or the sampling one.

The trainer reproduces them to compare (rlkit.train.mismatch) and the PPO loss uses them as the behaviour policy, so
their meaning must be known. It depends on the backend and on how the server was started; to fold into
`ServerBackend` (one method per backend) when the backends move behind it.

- vLLM 0.32 (`vllm/config/model.py` `ModelConfig.logprobs_mode`, `vllm/v1/sample/sampler.py`): the default
  `--logprobs-mode raw_logprobs` returns log_softmax of the logits before temperature, penalties and top-p/top-k;
  `processed_logprobs` the same after all of those (temperature-scaled, truncated and renormalised); the `*_logits`
  modes return logits, which are no log-probs at all.
- SGLang (`python/sglang/srt/layers/sampler.py`): log-probs of the temperature-scaled distribution, unless the server
  runs with SGLANG_RETURN_ORIGINAL_LOGPROB set (then raw).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rlkit.config.schema import ExperimentConfig

LogprobMeaning = Literal["raw", "temperature", "logits"]
_VLLM_MODES: dict[str, LogprobMeaning] = {"raw_logprobs": "raw", "processed_logprobs": "temperature",
                                          "raw_logits": "logits", "processed_logits": "logits"}
_TRUE = ("1", "true", "yes", "on")


def sampled_logprob_meaning(config: ExperimentConfig) -> LogprobMeaning:
    """What the configured servers return as the log-prob of a sampled token."""
    from rlkit.config.allocation import parse_allocation
    from rlkit.config.validate import parse_env_vars

    server = parse_allocation(config.allocation_mode).server
    if server is None:
        raise ValueError(f"allocation_mode {config.allocation_mode!r} has no inference servers")
    if server.backend == "vllm":
        extra = {str(k).replace("-", "_").lower(): v for k, v in config.vllm.extra_args.items()}
        mode = str(extra.get("logprobs_mode", "raw_logprobs"))
        if mode not in _VLLM_MODES:
            raise ValueError(f"vllm.extra_args.logprobs_mode {mode!r} is not one of {', '.join(_VLLM_MODES)}")
        return _VLLM_MODES[mode]
    if server.backend == "sglang":
        env = parse_env_vars("launcher.inference_server_env_vars", config.launcher.inference_server_env_vars)
        return "raw" if env.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in _TRUE else "temperature"
    raise ValueError(f"unknown server backend {server.backend!r}")

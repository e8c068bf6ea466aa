"""How the trainer builds a model from `actor.path`: AReaL's `disable_dropout` (every dropout probability of the
model's config set to 0 before the model is built, so training-mode forwards are deterministic and match the
servers', which never drop out) and `init_from_scratch` (the architecture of actor.path with random weights, drawn
from one fixed seed so every rank, and every run, starts from the same weights).
"""

from __future__ import annotations

from typing import Any

import torch

SCRATCH_SEED = 7919  # the random start of init_from_scratch: identical on every rank without any communication


def zero_dropout(config: Any) -> Any:
    """`config` (a transformers PretrainedConfig) with every dropout probability it holds set to 0, nested configs
    included (the keys rlkit.config.model_config.dropout_free reads)."""
    for key, value in list(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            zero_dropout(value)
        elif (("dropout" in key or "pdrop" in key) and isinstance(value, (int, float))
              and not isinstance(value, bool)):
            setattr(config, key, 0.0)
    return config


def model_config(path: str, *, disable_dropout: bool) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    return zero_dropout(config) if disable_dropout else config


def build_causal_lm(path: str, *, dtype: torch.dtype, attn_impl: str, disable_dropout: bool = False,
                    from_scratch: bool = False, meta: bool = False) -> torch.nn.Module:
    """The causal LM of `path`: its weights, or (from_scratch) its architecture with SCRATCH_SEED's random init, or
    (meta) its architecture on the meta device, no memory and no values (rlkit.trainer.sharded_load fills them), in
    the mode the real build returns (from_pretrained's eval mode, from_config's training mode: the modes a sharded
    build copies)."""
    from transformers import AutoModelForCausalLM

    config = model_config(path, disable_dropout=disable_dropout)
    if meta:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_impl)
        return model if from_scratch else model.eval()
    if from_scratch:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SCRATCH_SEED)
            return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_impl)
    return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype, attn_implementation=attn_impl)


_DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
             torch.nn.FeatureAlphaDropout)


def _config_dropouts(config: Any) -> list[float]:
    """Every dropout probability a transformers config holds (nested configs included): the keys `zero_dropout`
    sets."""
    found: list[float] = []
    for key, value in vars(config).items():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            found += _config_dropouts(value)
        elif (("dropout" in key or "pdrop" in key) and isinstance(value, (int, float))
              and not isinstance(value, bool)):
            found.append(float(value))
    return found


def has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether a training-mode forward of the built `model` draws dropout masks: a dropout module with p > 0 (peft's
    lora_dropout among them), or a dropout probability > 0 in its config (attention dropout is a number the attention
    function reads, no module). A model without a config is judged by its modules alone."""
    if any(isinstance(m, _DROPOUTS) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "model_type") and any(p != 0 for p in _config_dropouts(config))

"""One grpo step and one sft step through their real code (tests/helpers/packed_steps.py's runners) with
`actor.fsdp.ulysses_sp_size` = argv's sp, on each gloo rank (tests/unit/trainer/test_ulysses.py). Rank 0 saves the
results, and how many packed rows ran sequence parallel on it (so a run that silently fell back proves nothing)."""

from __future__ import annotations

import copy
import dataclasses
import random
import sys
from typing import Any

import torch

from rlkit.config.schema.actor import ActorConfig, FsdpConfig, MicroBatchSpec
from rlkit.models import ulysses
from rlkit.trainer.dist import init_distributed
from tests.helpers.packed_steps import SPEC, _actor, _examples, _pairs, _samples, _sft

sliced = [0]


def _counting(slice_row: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        sliced[0] += 1
        return slice_row(*args, **kwargs)

    return counted


def main(model_dir: str, out: str, sp: int) -> None:
    ulysses.slice_row = _counting(ulysses.slice_row)  # type: ignore[assignment]
    env, device = init_distributed()
    rng = random.Random(7)
    samples = _samples(rng)
    _pairs(rng)  # the same random stream as packed_steps: the same examples
    examples = _examples(rng)
    base = ActorConfig(path=model_dir, dtype="float32", attn_impl="sdpa", disable_dropout=True,
                       gradient_checkpointing=False, mb_spec=MicroBatchSpec(**SPEC), ppo_n_minibatches=2,
                       logprob_chunk_tokens=4, kl_loss_coef=0.1, recompute_logprob=True, use_decoupled_loss=True,
                       importance_sampling_level="token", fsdp=FsdpConfig(ulysses_sp_size=sp))

    def cfg(**changes: Any) -> ActorConfig:
        return dataclasses.replace(copy.deepcopy(base), **changes)

    results: dict[str, Any] = {
        "grpo": _actor(cfg(), env, device, samples),
        "grpo_checkpointed_full_logits": _actor(cfg(gradient_checkpointing=True, logprob_chunk_tokens=0), env,
                                                device, samples),
        "sft": _sft(cfg(), env, device, examples),
    }
    results["sliced_rows"] = sliced[0]
    if env.rank == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

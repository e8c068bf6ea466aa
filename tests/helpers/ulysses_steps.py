"""One grpo step, one ppo critic step (its engine in the same process as the actor's, as in ppo's trainer) and one sft
step through their real code (tests/helpers/packed_steps.py's runners) with `actor.fsdp.ulysses_sp_size` (and
`critic.fsdp.ulysses_sp_size`) = argv's sp, on each gloo rank (tests/unit/trainer/test_ulysses.py). Rank 0 saves the
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
from tests.helpers.packed_steps import SPEC, _actor, _critic, _examples, _pairs, _samples, _sft

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
        # chunked log-probs and the entropy bonus (its gradient split and gathered too); ppo's actor step is this one
        "grpo": _actor(cfg(entropy_coeff=0.05), env, device, samples),
        "grpo_full_logits": _actor(cfg(entropy_coeff=0.05, logprob_chunk_tokens=0), env, device, samples),
        "ppo_critic": _critic(cfg(), env, device, samples),  # values split and gathered as the log-probs are
        # full logits, and gradient checkpointing: its recompute in backward runs the all-to-all again
        "sft_checkpointed_full_logits": _sft(cfg(gradient_checkpointing=True, logprob_chunk_tokens=0), env, device,
                                             examples),
    }
    results["sliced_rows"] = sliced[0]
    results["families"] = families(sp)
    if env.rank == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))


def families(sp: int) -> dict[str, Any]:
    """Per model family of ULYSSES_MODEL_TYPES: a random tiny model's packed log-probs of fixed rows and the
    gradient of a weighted sum of them (every rank alike; rank 0's are compared with one rank's)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkit.config.schema.actor import ULYSSES_MODEL_TYPES
    from rlkit.models.packing import set_packing
    from rlkit.trainer.dist import init_sequence_parallel
    from rlkit.trainer.head_logprobs import model_token_logprobs

    out: dict[str, Any] = {}
    ids = torch.tensor([[5, 9, 13, 2, 7, 11, 3, 8, 4], [6, 1, 12, 14, 10, 0, 0, 0, 0], [3, 3, 9, 0, 0, 0, 0, 0, 0]])
    mask = (torch.arange(9)[None] < torch.tensor([[9], [5], [3]])).long()
    init_sequence_parallel(sp)
    for family in ULYSSES_MODEL_TYPES:
        config = AutoConfig.for_model(family, vocab_size=32, hidden_size=64, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, max_position_embeddings=64)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        set_packing(model, True)
        if sp > 1:
            ulysses.enable(model)
        logp, _ = model_token_logprobs(model, ids, mask, chunk_tokens=0)
        weights = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)
        (logp * weights).sum().backward()
        grads = {}
        for name, param in model.named_parameters():
            assert param.grad is not None, name
            grad = param.grad.clone()
            torch.distributed.all_reduce(grad)  # the sp ranks' parts add up to the whole gradient
            grads[name] = grad
        out[family] = {"logp": logp.detach(), "grads": grads}
    return out

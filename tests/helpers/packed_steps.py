"""One step of every job type through its real code (micro-batch split, loss, the engine's scaling and collectives),
run twice on the same weights, packed and padded, on each of N gloo ranks (tests/unit/trainer/test_packed_steps.py).

The optimizer never steps: the engine's clip-and-step is replaced by a recorder of every parameter's full gradient
(an all-gather under FSDP2), so both runs start from the same weights. Rank 0 saves, per job type and mode, the
loss, the per-sample results the algorithm gets back (log-probs, values) and every gradient, for the test to compare
packed with padded and one rank with two.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import sys
from collections.abc import Callable
from typing import Any

import torch

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec
from rlkit.config.schema.critic import CriticConfig
from rlkit.config.schema.ref import ReferenceLoad
from rlkit.jobs.dpo.algorithm import fill_missing
from rlkit.jobs.pairs.batch import pair_share
from rlkit.jobs.pairs.data import Pair
from rlkit.jobs.pairs.loss_fns import DPOLoss, rw_loss_fn
from rlkit.jobs.pairs.losses import ReferenceLogps
from rlkit.jobs.pairs.steps import CountedLoss, micro_batches
from rlkit.jobs.ppo.critic import PPOCritic
from rlkit.jobs.sft.algorithm import SFT
from rlkit.jobs.sft.data import SFTExample
from rlkit.jobs.sft.loss import sft_loss_fn
from rlkit.models.packing import packs, set_packing
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.dist import init_distributed
from rlkit.trainer.engine import TrainEngine, actor_model_factory, value_head_model
from rlkit.trainer.reference import frozen_reference
from rlkit.types import Sample

VOCAB = 400
SPEC = dict(n_mbs=2, max_tokens_per_mb=60)  # several micro-batches, a different split packed and padded


def _samples(rng: random.Random) -> list[Sample]:
    out = []
    for i in range(10):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))]
        completion = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 14))]
        behav = [-rng.uniform(0.5, 7.0) for _ in completion]
        advantages = [rng.uniform(-1, 1) for _ in completion]
        out.append(Sample(prompt, completion, behav, 0.0, 0, i % 3 != 0, i // 2, token_advantages=advantages))
    return out


def _pairs(rng: random.Random) -> list[Pair]:
    def tokens(low: int, high: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(low, high)))

    return [Pair(i, tokens(2, 6), tokens(1, 9), tokens(1, 9)) for i in range(6)]


def _examples(rng: random.Random) -> list[SFTExample]:
    out = []
    for _ in range(8):
        n = rng.randint(3, 16)
        prompt = rng.randint(1, n - 1)
        out.append(SFTExample([rng.randrange(1, VOCAB) for _ in range(n)], [0] * prompt + [1] * (n - prompt)))
    return out


def random_lora_b(engine: TrainEngine) -> None:
    """peft's B starts at 0, which leaves A without gradient; a constant B would leave the head's A a gradient of
    pure rounding (a softmax's gradient sums to 0 over the vocabulary): seeded random values, the same on every
    rank, each rank copying its shard."""
    from torch.distributed.tensor import distribute_tensor

    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                full = torch.randn(param.shape, generator=generator) * 0.05
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements))


def _record(engine: TrainEngine, into: dict[str, Any]) -> None:
    """The engine's step becomes: record every full gradient, zero them, leave the weights."""
    def record() -> float:
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters() if p.grad is not None}
        into.setdefault("grads", []).append(grads)
        engine.optimizer.zero_grad(set_to_none=True)
        return 0.0

    engine._clip_and_step = record  # type: ignore[method-assign]


def _modes(engines: list[TrainEngine], configs: list[ActorConfig], run: Callable[[], dict[str, Any]]
           ) -> dict[str, dict[str, Any]]:
    """run() packed, then padded, on the same weights."""
    out = {}
    for packed in (True, False):
        for config in configs:
            config.mb_spec.packing = packed
        for engine in engines:
            set_packing(engine.model, packed)
        out["packed" if packed else "padded"] = run()
        if packed:  # the packed run really packed (asked before the padded run turns packing off)
            out["packed"]["probed"] = all(packs(engine.model) for engine in engines)
    return out


def _actor(config: ActorConfig, env: Any, device: torch.device, samples: list[Sample]) -> dict[str, dict[str, Any]]:
    actor = PPOActor.build(config, rank=env.rank, world=env.world_size, device=device, pad_id=0, temperature=0.9,
                           total_optimizer_steps=1)
    if config.use_lora:
        random_lora_b(actor.engine)
    engines = [actor.engine]

    def run() -> dict[str, Any]:
        if actor.ref is not None:
            set_packing(actor.ref, config.mb_spec.packing)
        found: dict[str, Any] = {}
        _record(actor.engine, found)
        old = actor.logprobs_at(samples)
        ref = actor.logprobs_at(samples, reference=True) if actor.has_reference else None
        stats = actor.train_step(samples, old, ref)
        every = _gathered({**{f"old{i}": v for i, v in old.items()},
                           **{f"ref{i}": v for i, v in (ref or {}).items()}})
        return {"loss": stats["actor/loss"], "per_sample": every, "grads": found["grads"]}

    return _modes(engines, [config], run)


def _gathered(mine: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {k: v for part in every for k, v in part.items()}


def _critic(actor_cfg: ActorConfig, env: Any, device: torch.device, samples: list[Sample]
            ) -> dict[str, dict[str, Any]]:
    critic_cfg = CriticConfig(path=actor_cfg.path, dtype="float32", attn_impl="sdpa", disable_dropout=True,
                              ppo_n_minibatches=2, mb_spec=MicroBatchSpec(**SPEC),
                              fsdp=dataclasses.replace(actor_cfg.fsdp))  # one sp size per process, as submit asks
    critic = PPOCritic.build(critic_cfg, actor_cfg, rank=env.rank, world=env.world_size, device=device, pad_id=0,
                             total_optimizer_steps=1)
    returns = [[0.1 * (j % 5) - 0.2 for j in range(len(s.completion_ids))] for s in samples]

    def run() -> dict[str, Any]:
        found: dict[str, Any] = {}
        _record(critic.engine, found)
        values = _gathered(critic.values_at(samples))
        stats = critic.train_step(samples, values, returns)
        return {"loss": stats["critic/value_loss"], "per_sample": {f"v{i}": v for i, v in values.items()},
                "grads": found["grads"]}

    return _modes([critic.engine], [critic.config], run)


def _sft(config: ActorConfig, env: Any, device: torch.device, examples: list[SFTExample]
         ) -> dict[str, dict[str, Any]]:
    engine = TrainEngine(config, rank=env.rank, world=env.world_size, device=device, total_optimizer_steps=1,
                         model_factory=actor_model_factory(config))
    if config.use_lora:
        random_lora_b(engine)
    sft = SFT.__new__(SFT)  # the micro-batching of the real algorithm, without its datasets
    sft.config = dataclasses.replace(_stub_experiment(), actor=config)  # type: ignore[assignment]
    sft.rank, sft.world, sft.device, sft.pad_id, sft.engine = env.rank, env.world_size, device, 0, engine

    def run() -> dict[str, Any]:
        found: dict[str, Any] = {}
        _record(engine, found)
        micro, tokens, _ = sft._micro_batches(examples, list(range(len(examples))))
        sums = [0.0, 0.0]

        def loss_fn(model: Any, mb: Any) -> tuple[Any, int]:
            nll, n, stats = sft_loss_fn(model, mb, chunk_tokens=config.logprob_chunk_tokens)
            sums[0] += stats["nll_sum"]
            sums[1] += n
            return nll / max(1, n), n

        engine.optimizer_step(micro, loss_fn, tokens)
        total = _gathered({f"r{env.rank}": sums})
        nll = sum(v[0] for v in total.values()) / sum(v[1] for v in total.values())
        return {"loss": nll, "per_sample": {}, "grads": found["grads"]}

    return _modes([engine], [config], run)


def _stub_experiment() -> Any:
    from rlkit.config.schema.experiment import ExperimentConfig

    return ExperimentConfig()


def _pair_job(kind: str, config: ActorConfig, env: Any, device: torch.device, pairs: list[Pair]
              ) -> dict[str, dict[str, Any]]:
    factory = value_head_model if kind == "rw" else actor_model_factory(config)
    engine = TrainEngine(config, rank=env.rank, world=env.world_size, device=device, total_optimizer_steps=1,
                         model_factory=factory)
    reference = frozen_reference(ReferenceLoad(config.path, "float32", "sdpa"), device) if kind == "dpo" else None

    def run() -> dict[str, Any]:
        found: dict[str, Any] = {}
        _record(engine, found)
        if reference is not None:
            set_packing(reference, config.mb_spec.packing)
        mine = pair_share(pairs, list(range(len(pairs))), env.rank, env.world_size)
        mbs = micro_batches(mine, config.mb_spec, 0, pairs[0], device)
        if reference is not None:
            cache = ReferenceLogps()
            fill_missing(reference, mbs, cache, chunk_tokens=config.logprob_chunk_tokens)
            loss = CountedLoss(DPOLoss(cache, beta=0.1, chunk_tokens=config.logprob_chunk_tokens))
        else:
            loss = CountedLoss(rw_loss_fn)
        engine.optimizer_step(mbs, loss, len(mine))
        means = loss.means.reduce(["loss"])
        return {"loss": means["loss"], "per_sample": {}, "grads": found["grads"]}

    return _modes([engine], [config], run)


def main(model_dir: str, tied_dir: str, out: str, chunk: int) -> None:
    env, device = init_distributed()
    rng = random.Random(7)
    samples, pairs, examples = _samples(rng), _pairs(rng), _examples(rng)
    base = ActorConfig(path=model_dir, dtype="float32", attn_impl="sdpa", disable_dropout=True,
                       gradient_checkpointing=False, mb_spec=MicroBatchSpec(**SPEC), ppo_n_minibatches=2,
                       logprob_chunk_tokens=chunk, kl_loss_coef=0.1, recompute_logprob=True,
                       use_decoupled_loss=True, importance_sampling_level="sequence")

    def cfg(**changes: Any) -> ActorConfig:
        return dataclasses.replace(copy.deepcopy(base), **changes)

    lora = dict(use_lora=True, lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"])
    results = {
        "grpo": _actor(cfg(importance_sampling_level="token"), env, device, samples),
        "grpo_gspo_tied": _actor(cfg(path=tied_dir, ppo_epochs=2), env, device, samples),  # each pass's steps
        "grpo_lora": _actor(cfg(entropy_coeff=0.05, **lora), env, device, samples),  # the entropy's gradient too
        # actor.loss_agg_mode: a mean over sequences (cut completions dropped: rows with no trained token; the entropy
        # bonus averaged alike), and Dr.GRPO's constant under SAPO's gate (which takes no decoupled loss)
        "grpo_seq_mean": _actor(cfg(loss_agg_mode="seq-mean-token-mean", mask_no_eos_with_zero=True,
                                    entropy_coeff=0.05), env, device, samples),
        "grpo_seq_norm": _actor(cfg(importance_sampling_level="token", loss_agg_mode="seq-mean-token-sum-norm",
                                    loss_scale_factor=16, use_sapo_loss=True, use_decoupled_loss=False), env, device,
                                samples),
        # actor.policy_loss: CISPO with the decoupled loss's weight, GMPO (a mean over sequences) and GPG under LoRA
        "grpo_cispo": _actor(cfg(importance_sampling_level="token", policy_loss="cispo", eps_clip=10.0,
                                 eps_clip_higher=0.2), env, device, samples),
        "grpo_gmpo": _actor(cfg(importance_sampling_level="token", policy_loss="gmpo", eps_clip=0.4,
                                loss_agg_mode="seq-mean-token-mean"), env, device, samples),
        "grpo_gpg_lora": _actor(cfg(importance_sampling_level="token", policy_loss="gpg", use_decoupled_loss=False,
                                    **lora), env, device, samples),
        "ppo_critic": _critic(cfg(), env, device, samples),
        "sft": _sft(cfg(), env, device, examples),
        "sft_lora_tied": _sft(cfg(path=tied_dir, **lora), env, device, examples),
        "rw": _pair_job("rw", cfg(), env, device, pairs),
        "dpo": _pair_job("dpo", cfg(), env, device, pairs),
    }
    if env.rank == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))

"""The FSDP2 training engine under the PPO actor, on real torch.distributed (gloo, CPU): two ranks train like one.

Each test starts fresh processes (one per rank) that join a real gloo process group, shard the tiny model with
fully_shard, and take optimizer steps on the same hand-made batch. If the loss scaling across ranks, the dummy
micro-batches or the minibatch split were wrong, the two-rank weights would differ from the one-rank weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import json, sys, torch
from safetensors.torch import save_file
from rlkit.config.schema.actor import ActorConfig
from rlkit.types import Sample
from rlkit.trainer.dist import end_process, init_distributed
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.mismatch_step import step_mismatch
from rlkit.jobs.grpo.algorithm import set_token_advantages
from rlkit.trainer.rl_math.kl_controller import KLController

model, out, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
env, device = init_distributed()
actor = ActorConfig(path=model, dtype="float32", gradient_checkpointing=opts.get("ckpt", False), attn_impl="sdpa",
                    group_size=4, ppo_n_minibatches=2, kl_loss_coef=opts.get("kl", 0.0),
                    kl_ctl=opts.get("kl_ctl", 0.0), use_decoupled_loss=opts.get("decoupled", False),
                    use_lora=opts.get("lora", False), lora_rank=8, lora_alpha=16, target_modules=["all-linear"],
                    importance_sampling_level=opts.get("is_level", "token"))
actor.optimizer.type = "sgd"
actor.optimizer.lr = 0.5
actor.optimizer.weight_decay = 0.0
actor.optimizer.warmup_steps_proportion = 0.0
actor.optimizer.gradient_clipping = 0.0
actor.mb_spec.max_tokens_per_mb = opts.get("mb_tokens")
g = torch.Generator().manual_seed(0)
samples = []
for i in range(8):  # uneven lengths so ranks get different token counts and micro-batch counts
    p = torch.randint(5, 500, (3 + i % 3,), generator=g).tolist()
    c = torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
    samples.append(Sample(p, c, [-6.0] * len(c), float(i % 2), 0, True, i // 4, advantage=(1.0 if i % 2 else -1.0),
                          server=i % 2))
WILD = [1e4, float("-inf"), float("nan"), -1e4]  # what an inserted token may carry without changing anything
if opts.get("multiturn"):  # episodes: sampled turn, inserted tool result, sampled turn (some: inserted tail), mixed
    samples = []
    for i in range(8):
        p = torch.randint(5, 500, (3 + i % 3,), generator=g).tolist()
        segments = [(1 + i % 3, 1), (2 + i % 4, 0), (1 + (i * 3) % 4, 1)] + ([(2, 0)] if i % 4 == 3 else [])
        if i == 5:  # a single-turn sample among the episodes
            segments = [(4, 1)]
        mask = [m for n, m in segments for _ in range(n)]
        c = torch.randint(5, 500, (len(mask),), generator=g).tolist()
        behav = [-6.0 if m else (WILD[j % 4] if opts.get("wild") else 0.0) for j, m in enumerate(mask)]
        samples.append(Sample(p, c, behav, float(i % 2), 0, True, i // 4, advantage=(1.0 if i % 2 else -1.0),
                              server=i % 2, loss_mask=None if i == 5 else mask,
                              token_versions=None if i == 5 else [0 if m else -1 for m in mask]))


def plant_wild_advantages():
    """Huge advantages on inserted tokens, after the advantages were computed (they must stay unread)."""
    for s in samples:
        if opts.get("wild") and s.loss_mask is not None:
            s.token_advantages = [a if m else 1e6 for a, m in zip(s.token_advantages, s.loss_mask)]
policy = PPOActor.build(actor, rank=env.rank, world=env.world_size, device=device, pad_id=0, temperature=1.0,
                        total_optimizer_steps=4)
old = policy.logprobs_at(samples)
at_half = policy.logprobs_at(samples, temperature=0.5)
mismatch = step_mismatch(policy, samples, old, version=0, temperature=1.0)
ref = policy.logprobs_at(samples, reference=True) if policy.ref is not None else None
if opts.get("critic"):  # PPO's batch: values (gathered), GAE over them, the actor's then the critic's steps
    from rlkit.config.schema.critic import CriticConfig
    from rlkit.trainer.rl_math.advantage_batch import advantages_and_returns
    from rlkit.trainer.dist import gather_per_sample
    from rlkit.jobs.ppo.critic import PPOCritic
    actor.gae_lambda, actor.discount = 0.9, 0.95
    critic_cfg = CriticConfig(dtype="float32", gradient_checkpointing=False, attn_impl="sdpa", ppo_n_minibatches=2,
                              eps_clip=0.05)
    critic_cfg.optimizer.type = "sgd"
    critic_cfg.optimizer.lr = 0.1
    critic_cfg.optimizer.warmup_steps_proportion = 0.0
    critic_cfg.optimizer.gradient_clipping = 0.0
    critic_cfg.mb_spec.max_tokens_per_mb = opts.get("mb_tokens")
    critic = PPOCritic.build(critic_cfg, actor, rank=env.rank, world=env.world_size, device=device, pad_id=0,
                             total_optimizer_steps=2)
    values = gather_per_sample(critic.values_at(samples))
    for i, s in enumerate(samples):  # a critic's value at an inserted token is never used (GAE skips the token)
        if opts.get("wild") and s.loss_mask is not None:
            values[i] = [v if m else 1e9 for v, m in zip(values[i], s.loss_mask)]
    adv_stats, returns = advantages_and_returns(samples, None, None, actor, values)
    plant_wild_advantages()
    stats = {**policy.train_step(samples, old, ref), **critic.train_step(samples, values, returns)}
    critic_state = critic.engine.full_state_dict()
    if env.rank == 0:
        save_file({k: v.contiguous() for k, v in critic_state.items()}, out + "/critic.safetensors")
else:
    # as GRPO's step: gathers old/ref when kl_ctl > 0
    adv_stats = set_token_advantages(actor, samples, old, ref, KLController(actor))
    plant_wild_advantages()
    stats = {**policy.train_step(samples, old, ref), **adv_stats}
state = policy.engine.full_state_dict()
if actor.use_lora and env.rank == 0:  # only the adapter trained; compared as the merged model a checkpoint holds
    from rlkit.trainer.lora import merge_adapter_state
    from rlkit.weights.adapter_files import is_adapter_param
    trainable = [n for n, p in policy.engine.model.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter_param(n) for n in trainable), trainable
    state = merge_adapter_state(state, actor)
if env.rank == 0:
    save_file({k: v.contiguous() for k, v in state.items()}, out + "/weights.safetensors")
    json.dump({"stats": stats, "old": old, "at_half": at_half,
               "mismatch": {i: [m.tokens, m.abs_sum, m.max] for i, m in mismatch.items()}},
              open(out + "/stats.json", "w"))
torch.distributed.destroy_process_group()
print(f"rank {env.rank} done", flush=True)
end_process(0)  # as `rlkit train` ends: no interpreter teardown with FSDP's gloo group still referenced
'''


def _run(world: int, model: Path, out: Path, opts: dict[str, object]) -> dict[str, object]:
    out.mkdir(parents=True)
    outputs = run_ranks(world, ["-c", WORKER, str(model), str(out), json.dumps(opts)])
    assert all(f"rank {rank} done" in text for rank, text in enumerate(outputs)), "\n".join(outputs)
    result: dict[str, object] = json.loads((out / "stats.json").read_text())
    return result


def _weights(path: Path, name: str = "weights") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / f"{name}.safetensors"))


# The KL variant has both KL forms: the loss term (kl_loss_coef) and the reward penalty (kl_ctl), whose old/ref
# log-probs each rank gathers from the others; decoupled, so the penalty is on the behaviour log-probs (-6), which
# differ from the reference (at the old policy, old == ref and the penalty would be 0).
KL = {"mb_tokens": 24, "kl": 0.1, "kl_ctl": 0.05, "decoupled": True, "ckpt": True}


# PPO's batch: a critic's values feed GAE, then the critic takes two clipped value-loss steps of its own (eps_clip
# small enough that the clip decides some tokens in the second minibatch).
CRITIC = {"mb_tokens": 24, "critic": True}
# Job type ppo with actor.use_lora: a LoRA actor (adapters only) beside a critic that trains its whole model.
LORA_CRITIC = {**CRITIC, "lora": True}


# Multi-turn episodes (issue 12): samples whose completions mix sampled tokens with tokens rlkit inserted (loss mask 0),
# one single-turn sample among them; with GSPO's sequence-level ratio over the sampled tokens, and with a critic.
MULTITURN_KL = {**KL, "multiturn": True, "is_level": "sequence"}
MULTITURN_CRITIC = {**CRITIC, "multiturn": True}


@pytest.mark.parametrize("opts", [{}, KL, CRITIC, LORA_CRITIC, MULTITURN_KL, MULTITURN_CRITIC],
                         ids=["plain", "microbatched-kl", "critic", "lora-actor-full-critic", "multiturn-kl-gspo",
                              "multiturn-critic"])
def test_two_ranks_train_like_one(tiny_model_dir: Path, tmp_path: Path, opts: dict[str, object]) -> None:
    one = _run(1, tiny_model_dir, tmp_path / "one", opts)
    two = _run(2, tiny_model_dir, tmp_path / "two", opts)
    if opts.get("multiturn"):
        _assert_inserted_tokens_change_nothing(tiny_model_dir, tmp_path, opts, one)
    # the log-prob mismatch check adds up both ranks' shares on rank 0 (to the same sums as one rank)
    m1, m2 = one["mismatch"], two["mismatch"]
    assert isinstance(m1, dict) and isinstance(m2, dict) and set(m1) == set(m2) == {"0", "1"}
    for server in m1:
        assert m2[server][0] == m1[server][0] and m2[server][1:] == pytest.approx(m1[server][1:], rel=1e-5)
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    from safetensors.torch import load_file

    before = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max(float((w1[k] - before[k]).abs().max()) for k in before if k in w1)
    assert moved > 1e-3, "the step did not change the weights; the comparison below would prove nothing"
    assert set(w1) == set(w2)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=f"{k} differs between 1 and 2 ranks")
    s1, s2 = one["stats"], two["stats"]
    assert isinstance(s1, dict) and isinstance(s2, dict)
    assert s2["actor/loss"] == pytest.approx(s1["actor/loss"], rel=1e-4, abs=1e-6)
    assert s2["actor/entropy"] == pytest.approx(s1["actor/entropy"], rel=1e-4)
    # The first minibatch starts at the old policy: ratio 1 there, so clipping only happens in the second.
    assert 0.0 <= s1["actor/clip_fraction"] <= 1.0
    for key in ("actor/log_ratio_clamped", "actor/seq_log_ratio_clamped", "actor/kl_loss_clamped"):
        assert s2[key] == s1[key], key  # guard counts are summed over ranks
    if opts.get("kl_ctl"):
        assert s1["actor/kl_reward"] != 0 and s2["actor/kl_reward"] == pytest.approx(s1["actor/kl_reward"], rel=1e-6)
        assert s2["actor/behav_filtered_fraction"] == s1["actor/behav_filtered_fraction"]
    else:
        assert "actor/kl_reward" not in s1 and "actor/behav_filtered_fraction" not in s1
    if opts.get("critic"):
        _assert_critics_equal(tiny_model_dir, tmp_path, s1, s2)
    if opts.get("lora"):  # the critic never takes the actor's LoRA setting: its backbone trained too
        critic = _weights(tmp_path / "one", "critic")
        q_proj = "model.layers.0.self_attn.q_proj.weight"
        assert float((critic[q_proj] - before[q_proj]).abs().max()) > 1e-5


def _assert_inserted_tokens_change_nothing(model: Path, tmp_path: Path, opts: dict[str, object],
                                           one: dict[str, object]) -> None:
    """The same one-rank step with wild behaviour log-probs (huge, infinite, NaN), advantages and critic values on
    every inserted token: the same weights, statistics and mismatch, to the bit."""
    wild = _run(1, model, tmp_path / "wild", {**opts, "wild": True})
    assert wild["mismatch"] == one["mismatch"]
    assert wild["stats"] == one["stats"]
    for name in ("weights", "critic") if opts.get("critic") else ("weights",):
        clean, planted = _weights(tmp_path / "one", name), _weights(tmp_path / "wild", name)
        for k in clean:
            torch.testing.assert_close(planted[k], clean[k], rtol=0, atol=0, msg=f"{name} {k}: inserted tokens counted")


def _assert_critics_equal(model: Path, tmp_path: Path, s1: dict[str, float], s2: dict[str, float]) -> None:
    """The value models after the step: moved (the fresh head and the backbone), and equal for 1 and 2 ranks."""
    from rlkit.models.value_model import load_value_model

    c1, c2 = _weights(tmp_path / "one", "critic"), _weights(tmp_path / "two", "critic")
    before = load_value_model(model).state_dict()
    assert set(c1) == set(c2) and "score.weight" in c1
    moved = max(float((c1[k] - before[k]).abs().max()) for k in c1)
    assert moved > 1e-3, "the critic's step did not change its weights"
    for k in c1:
        torch.testing.assert_close(c2[k], c1[k], rtol=1e-4, atol=1e-5, msg=f"critic {k} differs between 1 and 2 ranks")
    assert s1["critic/value_loss"] > 0 and s2["critic/value_loss"] == pytest.approx(s1["critic/value_loss"], rel=1e-4)
    assert s2["critic/clip_fraction"] == pytest.approx(s1["critic/clip_fraction"], abs=1e-6)


def test_recomputed_logprobs_match_a_plain_forward(tiny_model_dir: Path, tmp_path: Path) -> None:
    """compute_logprobs under FSDP equals transformers' log_softmax on the same sequences (no shift mistakes), also at
    another temperature (the log-prob mismatch check's raw comparison), and the mismatch against the behaviour
    log-probs (-6 everywhere) is |old + 6| summed per server."""
    from transformers import AutoModelForCausalLM

    result = _run(1, tiny_model_dir, tmp_path / "one", {"mb_tokens": 16})
    old, at_half, mismatch = result["old"], result["at_half"], result["mismatch"]
    assert isinstance(old, dict) and len(old) == 8 and isinstance(at_half, dict) and isinstance(mismatch, dict)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    for i in range(8):
        p = torch.randint(5, 500, (3 + i % 3,), generator=g).tolist()
        c = torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        for got, temperature in ((old, 1.0), (at_half, 0.5)):
            logp = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            assert got[str(i)] == pytest.approx(logp[len(p) - 1 :].tolist(), abs=1e-4), f"sample {i} at {temperature}"
    for server in (0, 1):
        diffs = [abs(v + 6.0) for i in range(server, 8, 2) for v in old[str(i)]]
        tokens, abs_sum, largest = mismatch[str(server)]
        assert (tokens, abs_sum, largest) == (len(diffs), pytest.approx(sum(diffs)), pytest.approx(max(diffs)))

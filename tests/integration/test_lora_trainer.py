"""LoRA on the trainer (rlkit.trainer.lora) under real FSDP2 over torch gloo, one and two ranks.

A peft-wrapped tiny model is sharded per decoder layer, takes SGD steps on a fixed batch, and exports its adapter on
rank 0 from the shards. Proofs: the base weights did not move (only adapters train), the adapter did, two ranks give
the adapter one rank gives, and the exported directory loads back in plain peft (no rlkit) to the trainer's log-probs.
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
from transformers import AutoModelForCausalLM
from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.dist import end_process, init_distributed
from torch.distributed.fsdp import fully_shard
from rlkit.trainer.lora import decoder_layers, export_adapter, merge_adapter_state, wrap_lora
from rlkit.weights.adapter_files import is_adapter_param
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from rlkit.weights.fingerprint import trainer_probe_logprobs

model_dir, out = sys.argv[1], sys.argv[2]
env, device = init_distributed()
actor = ActorConfig(path=model_dir, dtype="float32", use_lora=True, lora_rank=8, lora_alpha=16,
                    target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])
model = wrap_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), actor)
assert len(decoder_layers(model)) == 2
for layer in decoder_layers(model):  # per decoder layer, found through the peft wrapper (what the engine must do)
    fully_shard(layer)
fully_shard(model)
assert type(decoder_layers(model)[0]).__name__.startswith("FSDP")
trainable = [p for p in model.parameters() if p.requires_grad]
names = [n for n, p in model.named_parameters() if p.requires_grad]
assert names and all(is_adapter_param(n) for n in names), names
optimizer = torch.optim.SGD(trainable, lr=0.5)
g = torch.Generator().manual_seed(0)
batch = torch.randint(5, 500, (4, 12), generator=g)
mine = batch[env.rank :: env.world_size]  # each rank its share; gradients are averaged by FSDP's reduce-scatter
for _ in range(3):
    optimizer.zero_grad()
    logits = model(input_ids=mine).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, mine[:, 1:, None]).squeeze(-1)
    (-logp.mean()).backward()
    optimizer.step()
probe = batch[0].tolist()
probe_lp = trainer_probe_logprobs(model, probe)
path = export_adapter(model, actor, model_dir, out + "/adapter")
full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p.detach()).cpu().clone()
        for n, p in model.named_parameters() if not is_adapter_param(n)}  # the base after the steps, gathered
state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # collective
if env.rank == 0:
    assert path is not None
    save_file({k: v.contiguous() for k, v in merge_adapter_state(state, actor).items()},
              out + "/merged.safetensors")
    save_file({k: v.contiguous() for k, v in full.items()}, out + "/base_after.safetensors")
    json.dump({"probe": probe, "probe_lp": probe_lp}, open(out + "/probe.json", "w"))
else:
    assert path is None
torch.distributed.destroy_process_group()
print(f"rank {env.rank} done", flush=True)
end_process(0)
'''


def _run(world: int, model: Path, out: Path) -> dict[str, list[float]]:
    out.mkdir(parents=True)
    run_ranks(world, ["-c", WORKER, str(model), str(out)])
    result: dict[str, list[float]] = json.loads((out / "probe.json").read_text())
    return result


def _plain_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_fsdp_over_peft_trains_only_the_adapter_and_exports_it_for_peft(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    one = _run(1, tiny_model_dir, tmp_path / "one")
    two = _run(2, tiny_model_dir, tmp_path / "two")

    # Only adapters train: every base weight, gathered from the shards after the steps, is bit-for-bit the file's.
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    for run in ("one", "two"):
        after = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
                 for k, v in load_file(str(tmp_path / run / "base_after.safetensors")).items()}
        assert set(after) == set(before)
        for name, tensor in before.items():
            assert torch.equal(after[name], tensor), f"{run}: base weight {name} changed"

    # The adapter moved (B starts at zero: a B that is still zero would prove nothing below).
    a1, a2 = (load_file(str(tmp_path / run / "adapter" / "adapter_model.safetensors")) for run in ("one", "two"))
    assert sorted(a1) == sorted(a2) and len(a1) == 2 * 4 * 2  # A and B, 4 modules, 2 layers
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in a1)  # peft's saved names (no adapter name)
    assert min(float(v.abs().max()) for k, v in a1.items() if "lora_B" in k) > 1e-4
    for name in a1:  # two ranks train like one
        torch.testing.assert_close(a2[name], a1[name], rtol=1e-4, atol=1e-6, msg=f"{name}: 1 vs 2 ranks")
    config = json.loads((tmp_path / "one" / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16, "LORA")
    assert config["target_modules"] == ["down_proj", "q_proj", "up_proj", "v_proj"]

    # The exported adapter in plain peft gives the trainer's log-probs; the base alone does not.
    probe = one["probe"]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    base_lp = _plain_logprobs(base, probe)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "one" / "adapter")).eval()
    peft_lp = _plain_logprobs(loaded, probe)
    assert peft_lp == pytest.approx(one["probe_lp"], abs=1e-5)
    assert two["probe_lp"] == pytest.approx(one["probe_lp"], abs=1e-4)
    assert sum(abs(a - b) for a, b in zip(peft_lp, base_lp, strict=True)) / len(base_lp) > 1e-3

    # The adapter merged into the base (what a saved checkpoint holds) is a plain model with the same log-probs.
    merged = load_file(str(tmp_path / "two" / "merged.safetensors"))
    assert set(merged) == set(before)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain.load_state_dict(merged)
    assert _plain_logprobs(plain.eval(), probe) == pytest.approx(two["probe_lp"], abs=1e-4)


ENGINE_WORKER = r'''
import json, sys, torch
from rlkit.config.schema.actor import ActorConfig
from rlkit.types import Sample
from rlkit.trainer.dist import end_process, init_distributed
from rlkit.trainer.lora import iter_adapter_buckets
from rlkit.weights.adapter_files import is_adapter_param
from rlkit.trainer.actor import PPOActor

model_dir, out = sys.argv[1], sys.argv[2]
env, device = init_distributed()
actor = ActorConfig(path=model_dir, dtype="float32", gradient_checkpointing=True, attn_impl="sdpa", group_size=4,
                    ppo_n_minibatches=2, kl_loss_coef=0.1, use_lora=True, lora_rank=8, lora_alpha=16,
                    target_modules=["all-linear"])
actor.optimizer.lr = 1e-2
g = torch.Generator().manual_seed(0)
samples = []
for i in range(8):
    p = torch.randint(5, 500, (3 + i % 3,), generator=g).tolist()
    c = torch.randint(5, 500, (2 + (i * 5) % 7,), generator=g).tolist()
    samples.append(Sample(p, c, [-6.0] * len(c), float(i % 2), 0, True, i // 4, advantage=(1.0 if i % 2 else -1.0),
                          server=i % 2))
probe = samples[0].prompt_ids + samples[0].completion_ids

def build():
    return PPOActor.build(actor, rank=env.rank, world=env.world_size, device=device, pad_id=0, temperature=1.0,
                          total_optimizer_steps=8)

def train(policy):
    old = policy.logprobs_at(samples)
    return policy.train_step(samples, old, policy.logprobs_at(samples, reference=True))

policy = build()
assert policy.ref is None and policy.has_reference  # no second model: the adapter switched off is the reference
trainable = [n for n, p in policy.engine.model.named_parameters() if p.requires_grad]
assert trainable and all(is_adapter_param(n) for n in trainable), trainable
initial = policy.logprobs_at(samples)
stats = [train(policy) for _ in range(2)]
reference_after = policy.logprobs_at(samples, reference=True)
trained = policy.logprobs_at(samples)
policy.engine.save_sharded(__import__("pathlib").Path(out) / "ckpt")
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
model_sd, optim_sd = get_state_dict(policy.engine.model, policy.engine.optimizer)  # the former format: base too
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out + "/full")
from safetensors import safe_open
from rlkit.trainer.rank_files import rank_files
saved = [k for path in rank_files(__import__("pathlib").Path(out) / "ckpt") for k in safe_open(str(path), "pt").keys()]
resumed = build()
resumed.engine.load_sharded(__import__("pathlib").Path(out) / "ckpt", policy.engine.optimizer_steps)
from_full = build()
from_full.engine.load_sharded(__import__("pathlib").Path(out) / "full", policy.engine.optimizer_steps)
at_resume = (policy.engine.probe_logprobs(probe), resumed.engine.probe_logprobs(probe))
full_resume = from_full.engine.probe_logprobs(probe)
train(policy), train(resumed)  # the same next step: the optimizer state came back too
after_next = (policy.engine.probe_logprobs(probe), resumed.engine.probe_logprobs(probe))
adapter = [b for b in iter_adapter_buckets(policy.engine.model)]
if env.rank == 0:
    json.dump({"initial": initial, "reference_after": reference_after, "trained": trained, "stats": stats,
               "at_resume": at_resume, "after_next": after_next, "adapter": sorted(adapter[0]),
               "saved": saved, "full_resume": full_resume},
              open(out + "/engine.json", "w"))
torch.distributed.destroy_process_group()
print(f"rank {env.rank} done", flush=True)
end_process(0)
'''


def test_lora_engine_trains_against_its_adapterless_reference_and_resumes(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    """The loop's TrainEngine with the LoRA model factory, as the GRPO trainer builds it (2 gloo ranks, gradient
    checkpointing): the KL reference is the model with its adapter off, so it stays the initial model while the
    adapter trains; a recover checkpoint (save_sharded/load_sharded: the adapter and its optimizer state, not the frozen
    base) resumes to the same weights and, after one more step, still the same (optimizer state restored); a
    checkpoint in the former format (the whole peft model) still loads."""
    out = tmp_path / "engine"
    out.mkdir()
    run_ranks(2, ["-c", ENGINE_WORKER, str(tiny_model_dir), str(out)])
    result = json.loads((out / "engine.json").read_text())
    initial, reference, trained = result["initial"], result["reference_after"], result["trained"]
    moved = max(abs(a - b) for i in initial for a, b in zip(initial[i], trained[i], strict=True))
    assert moved > 1e-2, "the adapter did not train; the reference check below would prove nothing"
    for i in initial:
        assert reference[i] == pytest.approx(initial[i], abs=1e-5), f"sample {i}: the reference moved"
    assert result["stats"][1]["actor/kl"] > 1e-3  # the second step is away from the reference (k3: >= 0)
    now, back = result["at_resume"]
    assert back == pytest.approx(now, abs=1e-6)
    now, back = result["after_next"]
    assert back == pytest.approx(now, abs=1e-5)
    assert max(abs(a - b) for a, b in zip(result["at_resume"][0], now, strict=True)) > 1e-4
    assert result["adapter"] and all(".lora_A." in k or ".lora_B." in k for k in result["adapter"])
    params = [k for k in result["saved"] if k.startswith("model/")]
    assert params and all(".lora_A." in k or ".lora_B." in k for k in params), params  # no frozen base weight
    assert result["full_resume"] == pytest.approx(result["at_resume"][0], abs=1e-6)

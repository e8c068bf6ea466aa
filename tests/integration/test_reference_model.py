"""The reference model of the KL terms and of dpo is ref.path's, not the actor's start (issue 14), on real
torch.distributed (gloo, CPU) ranks with the trainer's own builders (PPOActor.build as grpo/ppo call it,
DPOTraining): two tiny models with different seeds, the actor from one, ref.path the other. The reference log-probs
the trainer computes (FSDP-sharded, frozen) equal a direct transformers forward of ref.path's model and differ from
the actor's, with and without LoRA (where an empty ref.path would have been the base without the adapter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.tasks.digits_pairs import write_pair_splits
from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from rlkit.config.load import config_from_mapping
from rlkit.config.reference import reference_load
from rlkit.config.schema.ref import ReferenceLoad
from rlkit.trials.paths import TrialPaths
from rlkit.trainer.dist import end_process, init_distributed
from rlkit.jobs.dpo.algorithm import DPOTraining, fill_missing
from rlkit.trainer.loop import LoopContext
from rlkit.jobs.pairs.loss_fns import answer_logps
from rlkit.trainer.offline_epochs import rank_share
from rlkit.jobs.pairs.losses import by_pair
from rlkit.jobs.pairs.steps import local_pairs, micro_batches
from rlkit.trainer.actor import PPOActor
from rlkit.types import Sample

actor_dir, ref_dir, data, out, lora = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5] == "1"
env, device = init_distributed()
actor = {"path": actor_dir, "dtype": "float32", "attn_impl": "sdpa", "kl_loss_coef": 0.1, "kl_ctl": 0.05,
         "use_lora": lora, "lora_rank": 8, "lora_alpha": 16, "target_modules": ["all-linear"]}
common = {"experiment_name": "ref", "trial_name": "t", "ref": {"path": ref_dir}, "actor": actor,
          "cluster": {"fileroot": str(out / "root")}}


def direct(model_dir, seqs):
    """Per (prompt, completion): the completion's token log-probs of a plain transformers forward."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    with torch.no_grad():
        result = []
        for p, c in seqs:
            logp = model(torch.tensor([p + c])).logits[0].float().log_softmax(-1)
            result.append([float(logp[len(p) - 1 + j, t]) for j, t in enumerate(c)])
    return model, result


# grpo/ppo: the KL reference, as GRPO builds it
config = config_from_mapping({**common, "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1"}, [])
g = torch.Generator().manual_seed(0)
samples = [Sample(torch.randint(5, 500, (3 + i,), generator=g).tolist(),
                  torch.randint(5, 500, (4,), generator=g).tolist(), [-1.0] * 4, 0.0, 0, True, i, advantage=1.0)
           for i in range(4)]
policy = PPOActor.build(config.actor, rank=env.rank, world=env.world_size, device=device, pad_id=0,
                        temperature=1.0, total_optimizer_steps=1, ref=reference_load(config))
assert policy.ref is not None, "another model than actor.path is loaded as a model of its own (LoRA too)"
assert not any(p.requires_grad for p in policy.ref.parameters()) and not policy.ref.training, "frozen, eval mode"
kl_ref = policy.logprobs_at(samples, reference=True)
kl_own = policy.logprobs_at(samples)
# ref.dtype of its own: the same reference model computing in bfloat16 (a copy, with LoRA too)
half = PPOActor.build(config.actor, rank=env.rank, world=env.world_size, device=device, pad_id=0, temperature=1.0,
                      total_optimizer_steps=1, ref=ReferenceLoad(ref_dir, "bfloat16", "sdpa"))
assert half.ref is not None and half.ref is not policy.ref
kl_ref_bf16 = half.logprobs_at(samples, reference=True)
seqs = [(s.prompt_ids, s.completion_ids) for s in samples]
ref_model, ref_direct = direct(ref_dir, seqs)
actor_model, actor_direct = direct(actor_dir, seqs)

# dpo: the pair reference, as DPOTraining builds and runs it
dpo_config = config_from_mapping({**common, "type": "dpo", "allocation_mode": "fsdp:d1",
                                  "train_dataset": {"path": data, "batch_size": 8, "max_length": 64}}, [])
ctx = LoopContext(dpo_config, TrialPaths.of(str(out / "root"), "ref", "t"), env, device)
dpo = DPOTraining(ctx)
assert (dpo.reference is not None) and not dpo.reference.training
mine = local_pairs(dpo.data.train, rank_share(list(range(8)), env.rank, env.world_size))
mbs = micro_batches(mine, dpo_config.actor.mb_spec, dpo.data.pad_id, dpo.data.train[0], device)
with dpo._reference() as reference:
    fill_missing(reference, mbs, dpo.cache)
pairs = {"cached": [], "ref_direct": [], "actor_direct": []}
with torch.no_grad():
    for mb in mbs:
        if mb.dummy:
            continue
        batch = mb.batch
        chosen, rejected = dpo.cache.get(batch.indices)
        pairs["cached"] += [chosen.tolist(), rejected.tolist()]
        for name, model in (("ref_direct", ref_model), ("actor_direct", actor_model)):
            c, r = by_pair(answer_logps(model, batch))
            pairs[name] += [c.tolist(), r.tolist()]
if env.rank == 0:
    json.dump({"kl_ref": {str(k): v for k, v in kl_ref.items()},
               "kl_ref_bf16": {str(k): v for k, v in kl_ref_bf16.items()},
               "kl_own": {str(k): v for k, v in kl_own.items()},
               "ref_direct": ref_direct, "actor_direct": actor_direct, "pairs": pairs},
              open(out / "result.json", "w"))
torch.distributed.destroy_process_group()
print(f"rank {env.rank} done", flush=True)
end_process(0)
'''


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


@pytest.mark.parametrize(("world", "lora"), [(2, False), (1, True)], ids=["sharded-on-2-ranks", "lora"])
def test_the_kl_and_dpo_reference_is_ref_paths_model(tiny_model_dir: Path, tmp_path: Path, world: int,
                                                      lora: bool) -> None:
    from rlkit.models.tiny import build_tiny_model

    sft = build_tiny_model(tmp_path / "sft", seed=7)  # the same architecture and tokenizer, other weights
    train, _ = write_pair_splits(tmp_path / "data", train=16, held_out=4)
    out = tmp_path / "out"
    out.mkdir()
    outputs = run_ranks(world, ["-c", WORKER, str(tiny_model_dir), str(sft), str(train), str(out),
                                "1" if lora else "0"])
    assert all(f"rank {rank} done" in text for rank, text in enumerate(outputs)), "\n".join(outputs)
    result = json.loads((out / "result.json").read_text())
    ref = [result["kl_ref"][str(i)] for i in range(len(result["ref_direct"]))]
    own = [result["kl_own"][str(i)] for i in range(len(result["actor_direct"]))]
    assert _max_diff(ref, result["ref_direct"]) < 1e-4, "the KL reference is ref.path's model"
    assert _max_diff(own, result["actor_direct"]) < 1e-4, "the policy is actor.path's (the adapter starts at 0)"
    assert _max_diff(ref, own) > 1e-2, "the two models differ: the comparisons above prove something"
    half = [result["kl_ref_bf16"][str(i)] for i in range(len(result["ref_direct"]))]
    assert 1e-5 < _max_diff(half, result["ref_direct"]) < 0.2, "ref.dtype bfloat16: ref.path's model, in bfloat16"
    pairs = result["pairs"]
    assert pairs["cached"], "no pairs were scored"
    assert _max_diff(pairs["cached"], pairs["ref_direct"]) < 1e-3, "dpo's reference is ref.path's model"
    assert _max_diff(pairs["cached"], pairs["actor_direct"]) > 1e-2, "not the actor's start"

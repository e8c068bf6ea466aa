"""Chunked log-probs under FSDP2 on two real gloo ranks: the head's weight is sharded between forwards and gathered
by the root module's hooks, so the chunks must run inside the model's forward and backward. Through the engine's own
model (rlkit.trainer.engine.TrainEngine, gradient checkpointing on as by default), the log-probs, entropies and the
full gradient of every parameter equal the full-logits path's within 1e-5, for a tied head and a LoRA model; and
neither path's forward makes FSDP2 warn that the root module returned a view tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import json, sys, warnings
import torch
from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.dist import init_distributed
from rlkit.trainer.engine import TrainEngine, actor_model_factory
from rlkit.trainer.head_logprobs import model_token_logprobs

model_dir, lora = sys.argv[1], sys.argv[2] == "lora"
env, device = init_distributed()
config = ActorConfig(path=model_dir, dtype="float32", attn_impl="sdpa", disable_dropout=True, use_lora=lora,
                     lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
engine = TrainEngine(config, rank=env.rank, world=env.world_size, device=device, total_optimizer_steps=1,
                     model_factory=actor_model_factory(config))
model = engine.model
with torch.no_grad():
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.fill_(0.03)  # peft's B starts at 0, which would leave A without gradient
ids = torch.randint(0, 500, (2, 11), generator=torch.Generator().manual_seed(env.rank))
mask = torch.ones_like(ids)
mask[1, 7:] = 0

def run(chunk):
    model.zero_grad(set_to_none=True)
    logp, entropy = model_token_logprobs(model, ids, mask, temperature=0.8, chunk_tokens=chunk, with_entropy=True)
    (logp * torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)).sum().backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}  # collective
    return logp.detach(), entropy, grads

def relative(got, want):
    return float((got - want).abs().max() / want.abs().max())

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    full, chunked = run(0), run(4)
views = [str(w.message)[:80] for w in caught if "returned a view tensor" in str(w.message)]
sharded = sum(hasattr(p, "full_tensor") for p in model.parameters())
errors = {"logp": relative(chunked[0], full[0]), "entropy": relative(chunked[1], full[1]),
          "grads": max(relative(chunked[2][n], g) for n, g in full[2].items())}
print("RESULT " + json.dumps({"errors": errors, "grads": sorted(full[2]) == sorted(chunked[2]) and len(full[2]),
                              "sharded": sharded, "view_warnings": views}), flush=True)
'''


@pytest.mark.parametrize("mode", ["tied", "lora"])
def test_chunked_equals_full_under_fsdp2_on_two_ranks(mode: str, tiny_model_dir: Path, tied_model_dir: Path) -> None:
    model_dir = tied_model_dir if mode == "tied" else tiny_model_dir
    outputs = run_ranks(2, ["-c", WORKER, str(model_dir), mode])
    for rank, output in enumerate(outputs):
        line = next((ln for ln in output.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, f"rank {rank} printed no result:\n{output[-2000:]}"
        result = json.loads(line.removeprefix("RESULT "))
        assert result["sharded"] > 0, f"rank {rank}: no parameter was an FSDP2 DTensor"
        assert result["grads"] > (0 if mode == "lora" else 20), f"rank {rank}: gradients missing or different sets"
        assert result["view_warnings"] == [], f"rank {rank}: FSDP2 warned of a view output: {result['view_warnings']}"
        for what, error in result["errors"].items():
            assert error <= 1e-5, f"rank {rank}, {mode}: {what} differ by {error:.3g} (relative)"

"""The trainer's sharded build (rlkit.trainer.sharded_load: a meta skeleton on every rank, filled by each rank's own
rows of the checkpoint's safetensors, or by rank 0's full CPU model broadcast into the shards) against today's (every
rank builds the whole model, then FSDP2 shards it), on 1 and 2 real gloo ranks: every parameter (gathered) and every
buffer equal BITWISE, for the plain causal LM, init_from_scratch, LoRA (adapter included), the value model, a
tied-embedding model (still one parameter), the frozen reference (untied and tied), a bfloat16 checkpoint in two files
with a vocabulary that does not split evenly, and a checkpoint with a key that transformers renames, with the same
requires_grad and training flags and the same model config; and one optimizer step's loss, and the loss after it,
equal today's. Which path each case took is checked too: the checkpoint's rows exactly where the weights are the
checkpoint's, rank 0's broadcast otherwise (with one line saying why where the rows were tried)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoint_variants import Tensors, checkpoint_variant
from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import json, sys
import torch
import torch.nn.functional as F
from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.ref import ReferenceLoad
from rlkit.trainer import engine as engine_module, reference as reference_module
from rlkit.trainer.dist import init_distributed
from rlkit.trainer.engine import TrainEngine, actor_model_factory, value_head_model
from rlkit.trainer import sharded_load
from rlkit.trainer.sharded_load import build_sharded, shard_model

untied, tied, bf16, renamed, saved_value = sys.argv[1:6]
env, device = init_distributed()
paths = []  # which loader filled each sharded build

def spy(name):
    loader = getattr(sharded_load, name)
    setattr(sharded_load, name, lambda *args: paths.append(name) or loader(*args))

spy("load_slices"), spy("load_full")
host = []  # the bytes off the meta device of every model an actor factory built (a sharded build's whole models)

def record(name):
    factory = getattr(engine_module, name)
    def recorded(config, where):
        model = factory(config, where)
        host.append(sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()] if not t.is_meta))
        return model
    setattr(engine_module, name, recorded)  # the module's own: checkpoint_of knows the factories by identity

for name in ("causal_lm", "lora_causal_lm", "value_head_model"):
    record(name)
value_head_model = engine_module.value_head_model

def today(build, device, *, param_dtype, prepare=None, checkpoint=None):
    """The build before rlkit.trainer.sharded_load: the whole model on every rank, then sharded."""
    model = build(device).to(device)
    if prepare is not None:
        prepare(model)
    return shard_model(model, param_dtype=param_dtype)

def with_builder(builder, make):
    engine_module.build_sharded, reference_module.build_sharded = builder, builder
    try:
        return make()
    finally:
        engine_module.build_sharded, reference_module.build_sharded = build_sharded, build_sharded

def actor(path, **kw):
    return ActorConfig(**{"path": path, "dtype": "float32", "attn_impl": "sdpa", "disable_dropout": True, **kw})

LORA = dict(use_lora=True, lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
CASES = {"causal": (actor(untied), None), "scratch": (actor(untied, init_from_scratch=True), None),
         "lora": (actor(untied, **LORA), None), "tied_lora": (actor(tied, **LORA), None),
         "renamed_lora": (actor(renamed, **LORA), None), "value": (actor(untied, dtype="bfloat16"), value_head_model),
         "tied_value": (actor(tied), value_head_model), "saved_value": (actor(saved_value), value_head_model),
         "tied": (actor(tied), None), "bf16": (actor(bf16), None), "renamed": (actor(renamed), None),
         "reference": (untied, None), "tied_reference": (tied, None)}

def loss_fn(model, ids):
    logits = model(input_ids=ids).logits.float()
    if logits.shape[-1] == 1:
        return (logits - 0.5).pow(2).mean(), ids.numel()
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()), ids.numel()

def build(case, builder):
    config, factory = CASES[case]
    if isinstance(config, str):
        load = ReferenceLoad(config, "bfloat16", "sdpa")
        return with_builder(builder, lambda: reference_module.frozen_reference(load, device)), None
    factory = factory or actor_model_factory(config)
    engine = with_builder(builder, lambda: TrainEngine(config, rank=env.rank, world=env.world_size, device=device,
                                                       total_optimizer_steps=1, model_factory=factory))
    return engine.model, engine

def state(model):
    params = {n: p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for n, p in model.named_parameters()}
    return params, dict(model.named_buffers())

def is_tied(model):
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight

def differ(a, b):
    return sorted(set(a) ^ set(b)) + [n for n in a if n in b and not (a[n].dtype == b[n].dtype and
                                                                       torch.equal(a[n], b[n]))]

ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(env.rank))
results = {}
for case in sys.argv[6].split(","):
    del paths[:], host[:]
    new, new_engine = build(case, build_sharded)
    held = max(host, default=None)
    old, old_engine = build(case, today)
    (new_p, new_b), (old_p, old_b) = state(new), state(old)
    result = {"params": len(new_p), "buffers": sorted(new_b), "param_diff": differ(new_p, old_p),
              "buffer_diff": differ(new_b, old_b), "adapter": sum("lora_" in n for n in new_p),
              "tied": is_tied(new), "paths": list(paths), "held": held,
              "full": sum(p.numel() * p.element_size() for p in new_p.values()),
              "same_count": len(list(new.parameters())) == len(list(old.parameters())),
              "grad": [n for n, p in new.named_parameters() if p.requires_grad] ==
                      [n for n, p in old.named_parameters() if p.requires_grad],
              "training": [m.training for m in new.modules()] == [m.training for m in old.modules()],
              "config": new.config.to_dict() == old.config.to_dict()  # what rw saves beside the weights
                        and getattr(new, "peft_config", None) == getattr(old, "peft_config", None)}
    if new_engine is not None:
        losses = []
        for engine in (new_engine, old_engine):
            step = []
            engine.optimizer_step([ids], lambda m, mb: step.append(loss_fn(m, mb)) or step[-1], ids.numel())
            with torch.no_grad():
                losses.append([step[0][0].item(), loss_fn(engine.model, ids)[0].item()])
        result["losses"] = losses
    results[case] = result
print("RESULT " + json.dumps(results), flush=True)
'''

CASES = ("causal,scratch,lora,tied_lora,renamed_lora,value,tied_value,saved_value,tied,bf16,renamed,reference,"
         "tied_reference")
TRIED = 2  # the cases that try the rows and fall back: renamed, renamed_lora
FROM_ROWS = {"causal", "tied", "bf16", "reference", "tied_reference",  # the weights are exactly the checkpoint's,
             "lora", "tied_lora", "value", "tied_value", "saved_value"}  # or its base's, and what each rank draws
VOCAB = 509  # rows of the embedding and the head: 255 and 254 on 2 ranks


@pytest.fixture(scope="module")
def bf16_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model in bfloat16 (not float32: cast on loading) in two files, with VOCAB rows."""
    def edit(tensors: Tensors) -> Tensors:
        return {k: (v[:VOCAB] if v.shape[0] == 512 else v).to(torch.bfloat16) for k, v in tensors.items()}

    return checkpoint_variant(tiny_model_dir, tmp_path_factory.mktemp("bf16") / "model", edit,
                              config={"vocab_size": VOCAB, "dtype": "bfloat16"}, files=2)


@pytest.fixture(scope="module")
def renamed_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with one key saved without the base model's prefix (transformers adds it back on loading)."""
    def edit(tensors: Tensors) -> Tensors:
        return {k.removeprefix("model.") if k == "model.norm.weight" else k: v for k, v in tensors.items()}

    return checkpoint_variant(tiny_model_dir, tmp_path_factory.mktemp("renamed") / "model", edit)


@pytest.fixture(scope="module")
def saved_value_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a saved value model (rw's): a score head of its own instead of the LM head."""
    def edit(tensors: Tensors) -> Tensors:
        head = torch.randn(1, 128, generator=torch.Generator().manual_seed(3))
        return {**{k: v for k, v in tensors.items() if k != "lm_head.weight"}, "score.weight": head,
                "score.bias": torch.tensor([0.25])}

    return checkpoint_variant(tiny_model_dir, tmp_path_factory.mktemp("saved_value") / "model", edit,
                              config={"architectures": ["Qwen2ForTokenClassification"], "num_labels": 1})


@pytest.mark.parametrize("world", [1, 2])
def test_sharded_build_equals_todays_full_build(world: int, tiny_model_dir: Path, tied_model_dir: Path,
                                                bf16_dir: Path, renamed_dir: Path, saved_value_dir: Path) -> None:
    dirs = [str(tiny_model_dir), str(tied_model_dir), str(bf16_dir), str(renamed_dir), str(saved_value_dir)]
    outputs = run_ranks(world, ["-c", WORKER, *dirs, CASES])
    for rank, output in enumerate(outputs):
        said = [ln for ln in output.splitlines() if ln.startswith("rlkit train: rank 0 builds the whole model")]
        assert len(said) == (TRIED if rank == 0 else 0), f"rank {rank}: lines on the fallback: {said}"
        assert all("norm.weight -> model.norm.weight" in line for line in said), said  # the renamed case's
        line = next((ln for ln in output.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, f"rank {rank} printed no result:\n{output[-2000:]}"
        results = json.loads(line.removeprefix("RESULT "))
        assert sorted(results) == sorted(CASES.split(","))
        for case, got in results.items():
            where = f"rank {rank} of {world}, {case}"
            assert got["params"] > 20, f"{where}: {got['params']} parameters"
            assert any(b.endswith("rotary_emb.inv_freq") for b in got["buffers"]), f"{where}: buffers {got['buffers']}"
            assert got["param_diff"] == [], f"{where}: parameters differ from today's build: {got['param_diff']}"
            assert got["buffer_diff"] == [], f"{where}: buffers differ from today's build: {got['buffer_diff']}"
            assert got["same_count"] and got["grad"] and got["training"] and got["config"], f"{where}: {got}"
            assert (got["adapter"] > 0) == case.endswith("lora"), f"{where}: {got['adapter']} adapter parameters"
            tied = case.startswith("tied") and case != "tied_value"
            assert got["tied"] == tied, f"{where}: lm_head tied to the embeddings: {got['tied']}"
            path = "load_slices" if case in FROM_ROWS else "load_full"
            if not case.endswith("reference"):  # rank 0 built a whole model on its host only where it broadcasts
                whole = rank == 0 and path == "load_full"
                assert (got["held"] >= got["full"]) == whole, f"{where}: {got['held']} bytes held, {got['full']} whole"
                assert whole or got["held"] * 50 < got["full"], f"{where}: {got['held']} bytes of {got['full']} held"
            assert got["paths"] == [path], f"{where}: loaded by {got['paths']}, not {path}"
            if not case.endswith("reference"):
                (new_step, new_after), (old_step, old_after) = got["losses"]
                assert new_step == old_step and new_after == old_after, f"{where}: losses {got['losses']}"
                assert new_after != new_step, f"{where}: the step changed nothing: {got['losses']}"

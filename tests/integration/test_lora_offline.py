"""LoRA (actor.use_lora) in the trainer-only job types sft and dpo, on the training loop with real torch.distributed
(gloo, CPU) ranks and the tiny model, without Slurm.

- sft: the validation loss falls with only the adapter training; 2 ranks train like 1; checkpoints/final is the
  merged model (a plain Hugging Face directory) with the peft adapter in adapter/, and both compute the same
  log-probs; a recover checkpoint holds the adapter and its optimizer state only (not the frozen base), and a run
  killed after it and started again ends exactly where an uninterrupted run ends.
- dpo: the held-out margin rises, and the reference (the trained model with its adapter off, no second model)
  gives exactly the base model's log-probs, also for pairs first seen after the adapter had trained.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.gloo_ranks import run_ranks, start_ranks, wait_ranks

WORKER = r'''
import sys
from pathlib import Path
from rlkit.config.load import load_config
from rlkit.trainer.dist import end_process
from rlkit.jobs.{module}.algorithm import run_{module}

trial = Path(sys.argv[1])
run_{module}(trial, load_config(trial / "config.yaml"))
end_process(0)
'''

LORA = {"use_lora": True, "lora_rank": 8, "lora_alpha": 16, "target_modules": ["all-linear"]}
# sft: 96 rows, 16 per step: 6 steps per epoch, 2 epochs; a recover checkpoint at epoch 1's end, the kill 2 later
ROWS, BATCH, EPOCHS = 96, 16, 2
PER_EPOCH = ROWS // BATCH
KILLED_AFTER = PER_EPOCH + 2


def _worker(module: str) -> list[str]:
    return ["-c", WORKER.replace("{module}", module)]


def _trial(root: Path, name: str, job: str, model: Path, data: tuple[Path, Path], *, lr: float, epochs: int,
           batch: int, recover: dict[str, object] | None = None, dataset: dict[str, object] | None = None) -> Path:
    trial = root / name
    trial.mkdir()
    config = {"experiment_name": "lora", "trial_name": name, "type": job, "allocation_mode": "fsdp:d1", "seed": 3,
              "actor": {"path": str(model), "dtype": "float32", "attn_impl": "sdpa", **LORA,
                        "mb_spec": {"max_tokens_per_mb": 128},
                        "optimizer": {"lr": lr, "weight_decay": 0.0, "warmup_steps_proportion": 0.0,
                                      "lr_scheduler_type": "constant"}},
              "train_dataset": {**(dataset or {}), "path": str(data[0]), "batch_size": batch, "shuffle": True},
              "valid_dataset": {**(dataset or {}), "path": str(data[1]), "batch_size": batch, "shuffle": False},
              "total_train_epochs": epochs, "saver": {"freq_steps": None, "freq_epochs": None, "freq_secs": None},
              "recover": {"mode": "disabled", "freq_steps": None, "freq_secs": None, **(recover or {})}}
    if job == "sft":
        config["sft"] = {"apply_chat_template": False}
    (trial / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    return trial


def _sft_trial(root: Path, name: str, model: Path, data: tuple[Path, Path], **recover: object) -> Path:
    return _trial(root, name, "sft", model, data, lr=1e-2, epochs=EPOCHS, batch=BATCH, recover=recover,
                  dataset={"type": "sft", "max_length": 32})


def _metrics(trial: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]


def _final(trial: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(trial / "checkpoints" / "final" / "model.safetensors"))


def _adapter(trial: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(trial / "checkpoints" / "final" / "adapter" / "adapter_model.safetensors"))


def _logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from rlkit.tasks.digits_sft import write_sft_dataset

    return write_sft_dataset(tmp_path_factory.mktemp("sft-data"), count=ROWS, valid_count=32)


@pytest.fixture(scope="module")
def straight(tiny_model_dir: Path, sft_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, Path]:
    """An uninterrupted 2-rank LoRA sft run and a 1-rank one, side by side (most of a run is starting python)."""
    root = tmp_path_factory.mktemp("lora-sft")
    two, one = _sft_trial(root, "two", tiny_model_dir, sft_data), _sft_trial(root, "one", tiny_model_dir, sft_data)
    single = start_ranks(1, [*_worker("sft"), str(one)])
    run_ranks(2, [*_worker("sft"), str(two)])
    wait_ranks(single)
    return two, one


def test_lora_sft_lowers_the_validation_loss_and_saves_a_merged_model_with_its_adapter(
        straight: tuple[Path, Path], tiny_model_dir: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    trial = straight[0]
    metrics = _metrics(trial)
    assert [int(m["step"]) for m in metrics] == list(range(1, EPOCHS * PER_EPOCH + 1))
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    untrained = metrics[0]["sft/loss"]
    assert len(evals) == EPOCHS and untrained > 5.0, (untrained, evals)
    # measured (seed 3): 6.199 nats per target token before training (about ln 512), 4.974 after epoch 1, 4.867 after
    # epoch 2; the adapter never touches the output head, so it learns less than full sft (1.45). Asserted: half the
    # measured first drop, and a further fall, which a run whose adapter did not train (B stays 0) cannot show
    assert evals[0] < untrained - 0.6 and evals[1] < evals[0] - 0.05, (untrained, evals)

    final = trial / "checkpoints" / "final"
    merged, initial = _final(trial), load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(merged) == set(initial), "the merged checkpoint is a plain model: the base's names, no adapter keys"
    assert max(float((merged[k] - initial[k]).abs().max()) for k in initial) > 1e-3, "nothing was merged in"
    adapter_config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (8, 16)
    # the merged model and base + adapter (plain peft) compute the same, and not what the base computes
    ids = [int(i) for i in torch.randint(5, 500, (16,), generator=torch.Generator().manual_seed(1))]
    plain = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    base_lp = _logprobs(base, ids)
    with_adapter = PeftModel.from_pretrained(base, str(final / "adapter")).eval()
    torch.testing.assert_close(_logprobs(with_adapter, ids), _logprobs(plain, ids), rtol=0, atol=1e-4)
    assert float((_logprobs(plain, ids) - base_lp).abs().mean()) > 1e-2


def test_lora_sft_on_two_ranks_trains_like_one(straight: tuple[Path, Path]) -> None:
    two, one = straight
    a1, a2 = _adapter(one), _adapter(two)
    assert set(a1) == set(a2) and min(float(v.abs().max()) for k, v in a1.items() if "lora_B" in k) > 1e-4
    for k in a1:  # the tolerance of the other two-ranks tests (test_trainer_engine.py)
        torch.testing.assert_close(a2[k], a1[k], rtol=1e-4, atol=1e-5, msg=f"{k} differs between 1 and 2 ranks")
    w1, w2 = _final(one), _final(two)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=f"{k} differs between 1 and 2 ranks")
    losses = [m["sft/loss"] for m in _metrics(one)]
    assert losses == [pytest.approx(m["sft/loss"], rel=1e-4) for m in _metrics(two)]


def _checkpoint_keys(directory: Path) -> list[str]:
    """The tensor names of an engine's rank files ("model/<fqn>", "optim/<fqn>/<state>")."""
    from safetensors import safe_open

    from rlkit.trainer.rank_files import rank_files

    keys: list[str] = []
    for path in rank_files(directory):
        with safe_open(str(path), "pt") as f:
            keys.extend(f.keys())
    return keys


def test_a_killed_lora_run_resumes_exactly_from_an_adapter_only_checkpoint(
        straight: tuple[Path, Path], tiny_model_dir: Path, sft_data: tuple[Path, Path], tmp_path: Path) -> None:
    from rlkit.trainer import recover

    trial = _sft_trial(tmp_path, "killed", tiny_model_dir, sft_data, mode="auto", freq_steps=PER_EPOCH)
    fault = {"RLKIT_FAULT_INJECT": f"die_after_step@{KILLED_AFTER}"}
    first = run_ranks(2, [*_worker("sft"), str(trial)], fault, expect=-9)
    assert f"rlkit train: step {KILLED_AFTER}/" in first[0]
    found = recover.latest_valid(recover.recover_root(trial))
    assert found is not None and found[0] == PER_EPOCH
    keys = _checkpoint_keys(recover.shards_dir(found[1], "actor"))
    params = [k for k in keys if k.startswith("model/")]
    assert params and all(".lora_A." in k or ".lora_B." in k for k in params), params  # no frozen base weight
    assert any(k.startswith("optim/") for k in keys), "the optimizer state is saved too"
    size = sum(p.stat().st_size for p in found[1].rglob("*") if p.is_file())
    base = (tiny_model_dir / "model.safetensors").stat().st_size
    assert size < base / 2, (size, base)  # adapter + its two Adam moments: a fraction of the base

    second = run_ranks(2, [*_worker("sft"), str(trial)], {**fault, "RLKIT_STEP_RETRY": "1"})
    assert f"resuming after step {PER_EPOCH} " in second[0]
    assert [int(m["step"]) for m in _metrics(trial)] == list(range(1, EPOCHS * PER_EPOCH + 1))
    for a, b in zip(_metrics(trial), _metrics(straight[0]), strict=True):
        assert a["sft/loss"] == b["sft/loss"] and a.get("eval/loss") == b.get("eval/loss"), (a["step"], a, b)
    before, after = _adapter(straight[0]), _adapter(trial)
    assert set(after) == set(before)
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=f"{k} differs after the resume")


def _base_answer_logps(model_dir: Path, data: Path) -> dict[int, tuple[float, float]]:
    """Each pair's (chosen, rejected) answer log-prob sums under the plain base model, by dataset row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import DPOConfig
    from rlkit.jobs.pairs.batch import pack_pairs
    from rlkit.jobs.pairs.data import pairs_from_config
    from rlkit.jobs.pairs.loss_fns import answer_logps
    from rlkit.jobs.pairs.losses import by_pair

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs, _ = pairs_from_config(DatasetConfig(path=str(data)), DPOConfig(), tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = pack_pairs(pairs, int(tokenizer.pad_token_id))
    with torch.no_grad():
        chosen, rejected = by_pair(answer_logps(model, batch))
    return {i: (float(c), float(r)) for i, c, r in zip(batch.indices, chosen, rejected, strict=True)}


def test_lora_dpo_raises_the_margin_against_the_base_as_its_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rlkit.tasks.digits_pairs import write_pair_splits
    from rlkit.trainer import recover

    data = write_pair_splits(tmp_path / "data", train=32, held_out=16)
    # 4 steps per epoch; the recover checkpoint after epoch 1 holds every reference value computed so far: those of
    # steps 2-4 and of the held-out pairs (epoch 1's end) were computed after the adapter had trained
    trial = _trial(tmp_path, "dpo", "dpo", tiny_model_dir, data, lr=2e-2, epochs=3, batch=8,
                   recover={"mode": "auto", "freq_steps": 4}, dataset={"max_length": 64})
    run_ranks(2, [*_worker("dpo"), str(trial)])
    evals = [m for m in _metrics(trial) if "eval/reward_margin" in m]
    assert [m["step"] for m in evals] == [4, 8, 12]
    # before training the margin is 0 (the policy is its reference); measured: 0.189, 0.217, 0.210 after each epoch
    # (the adapter leaves the output head alone, so it moves less than full dpo's 1+), accuracy 0.94, 1.0, 1.0
    assert evals[-1]["eval/reward_margin"] > 0.1 and evals[-1]["eval/accuracy"] >= 0.9, evals

    found = recover.latest_valid(recover.recover_root(trial))
    assert found is not None and found[0] == 8
    state = recover.LoopState.from_json((found[1] / recover.STATE).read_text()).algorithm
    for key, path in (("reference", data[0]), ("valid_reference", data[1])):
        base = _base_answer_logps(tiny_model_dir, path)
        cached = {int(i): v for i, v in state[key].items()}
        assert set(cached) == set(base), key
        for i, (chosen, rejected) in base.items():
            assert cached[i] == pytest.approx([chosen, rejected], abs=1e-4), (key, i)

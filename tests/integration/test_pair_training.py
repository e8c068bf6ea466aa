"""Job types rw and dpo on the training loop (rlkit.jobs.rw.algorithm / rlkit.jobs.dpo.algorithm), with real
torch.distributed (gloo, CPU) ranks on the tiny model and the digits preference pairs (rlkit.tasks.digits_pairs),
without Slurm.

- rw: the trained reward model orders held-out pairs (prompts never trained on) right. The bar, 0.9, comes from the
  pair task's measurements: an untrained head's held-out accuracy spreads over 0.05..0.78 across head seeds (never
  0.9), and training reaches 1.0. The test also asks for a gain over the very same untrained model (head seed 0),
  and that the saver's checkpoint reloads as that reward model, head included (it scores as the eval said).
- dpo: 2 ranks train like 1 (same weights within the GRPO 1-vs-2-rank test's tolerance), and the held-out
  chosen-over-rejected implicit reward margin, 0 before training (the policy is the reference), ends well above 0.
  A run stopped by USR1 keeps its data position and the reference log-probs in its recover state, and resumed it
  ends with the very weights of a run that was never stopped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from rlkit.tasks.digits_pairs import write_pair_splits
from tests.helpers.gloo_ranks import start_ranks, wait_ranks

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

STOPPING_DPO = r'''
import os, signal, sys
from pathlib import Path
from rlkit.config.load import load_config
from rlkit.trainer.dist import end_process
from rlkit.jobs.dpo.algorithm import DPOTraining
from rlkit.trainer.loop import run_training


class StopsAfterStep2(DPOTraining):
    """With STOP_AT_2 set, rank 0 gets USR1 (Slurm's time-limit warning) during step 2."""

    def step(self, step):
        result = super().step(step)
        if step == 2 and self.rank == 0 and os.environ.get("STOP_AT_2"):
            os.kill(os.getpid(), signal.SIGUSR1)
        return result


trial = Path(sys.argv[1])
run_training(trial, load_config(trial / "config.yaml"), StopsAfterStep2)
end_process(0)
'''


def _start(module: str, world: int, trial: Path, extra_env: dict[str, str] | None = None,
           code: str | None = None) -> list[subprocess.Popen[str]]:
    script = code if code is not None else WORKER.replace("{module}", module)
    return start_ranks(world, ["-c", script, str(trial)], extra_env)


def _run(module: str, world: int, trial: Path) -> list[str]:
    return _wait(_start(module, world, trial))


def _wait(procs: list[subprocess.Popen[str]]) -> list[str]:
    return wait_ranks(procs)


def _trial(tmp_path: Path, name: str, job: str, model: Path, data: tuple[Path, Path], *, lr: float, epochs: int,
           batch: int = 16, recover_mode: str = "disabled") -> Path:
    trial = tmp_path / name
    trial.mkdir()
    config = {"experiment_name": "pairs", "trial_name": name, "type": job, "allocation_mode": "fsdp:d1", "seed": 3,
              "actor": {"path": str(model), "dtype": "float32", "attn_impl": "sdpa",
                        "optimizer": {"type": "adam", "lr": lr, "weight_decay": 0.0, "warmup_steps_proportion": 0.0,
                                      "lr_scheduler_type": "constant"}},
              "train_dataset": {"path": str(data[0]), "batch_size": batch, "shuffle": True, "max_length": 64},
              "valid_dataset": {"path": str(data[1]), "batch_size": batch},
              "total_train_epochs": epochs, "saver": {"freq_epochs": None, "freq_steps": None, "freq_secs": None},
              "recover": {"mode": recover_mode, "freq_steps": None, "freq_secs": None}}
    (trial / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    return trial


def _metrics(trial: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]


def _heldout_accuracy(model_dir: Path, tokenizer_dir: Path, heldout: Path) -> float:
    """Held-out pair accuracy of the reward model at `model_dir` (a causal LM gets the seeded fresh head)."""
    from transformers import AutoTokenizer

    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import RWConfig
    from rlkit.jobs.pairs.batch import pack_pairs
    from rlkit.jobs.pairs.data import pairs_from_config
    from rlkit.jobs.pairs.loss_fns import rw_loss_fn
    from rlkit.models.value_model import load_value_model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    pairs, _ = pairs_from_config(DatasetConfig(path=str(heldout)), RWConfig(), tokenizer)
    model = load_value_model(model_dir).eval()
    with torch.no_grad():
        _, _, stats = rw_loss_fn(model, pack_pairs(pairs, int(tokenizer.pad_token_id)))
    return stats["accuracy"]


def test_rw_ranks_heldout_pairs_and_saves_a_reward_model_with_its_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write_pair_splits(tmp_path / "data", train=64, held_out=64)
    trial = _trial(tmp_path, "rw", "rw", tiny_model_dir, data, lr=1e-3, epochs=2)
    _run("rw", 2, trial)
    metrics = _metrics(trial)
    assert [m["step"] for m in metrics] == list(range(1, 9))  # 64 pairs / 16 = 4 steps per epoch, 2 epochs
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [4, 8]  # eval at each epoch's end
    assert all("rw/loss" in m and "rw/accuracy" in m for m in metrics)

    untrained = _heldout_accuracy(tiny_model_dir, tiny_model_dir, data[1])
    trained = metrics[-1]["eval/accuracy"]
    assert trained >= 0.9 and trained > untrained, (trained, untrained)
    assert metrics[-1]["eval/reward_margin"] > 0

    final = trial / "checkpoints" / "final"
    assert json.loads((final / "rlkit_value_head.json").read_text())["kind"] == "reward"
    reloaded = _heldout_accuracy(final, tiny_model_dir, data[1])
    assert abs(reloaded - trained) < 1e-6, (reloaded, trained)  # the head came back with the backbone


def _final_weights(trial: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((trial / "checkpoints" / "final").glob("*.safetensors"))))


def test_dpo_raises_the_heldout_margin_and_two_ranks_train_like_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write_pair_splits(tmp_path / "data", train=32, held_out=32)
    one = _trial(tmp_path, "dpo1", "dpo", tiny_model_dir, data, lr=3e-3, epochs=3, batch=8)
    two = _trial(tmp_path, "dpo2", "dpo", tiny_model_dir, data, lr=3e-3, epochs=3, batch=8)
    single = _start("dpo", 1, one)  # side by side: most of each run is starting python, torch and the model
    outputs = _run("dpo", 2, two)
    _wait(single)
    assert "32 training pairs" in outputs[0]

    metrics = _metrics(two)
    evals = [m for m in metrics if "eval/reward_margin" in m]
    assert [m["step"] for m in evals] == [4, 8, 12]
    assert evals[-1]["eval/reward_margin"] > 1.0 and evals[-1]["eval/accuracy"] >= 0.9, evals
    assert evals[-1]["eval/reward_margin"] > evals[0]["eval/reward_margin"], evals  # still rising after epoch 1
    assert all({"dpo/loss", "dpo/reward_margin", "dpo/accuracy"} <= set(m) for m in metrics)

    w1, w2 = _final_weights(one), _final_weights(two)
    from safetensors.torch import load_file

    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max(float((w1[k] - initial[k]).abs().max()) for k in initial if k in w1)
    assert moved > 1e-3, "training did not change the weights; the comparison below would prove nothing"
    assert set(w1) == set(w2)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=f"{k} differs between 1 and 2 ranks")


def test_a_requeued_dpo_run_keeps_its_reference_logprobs_and_ends_like_a_straight_run(tiny_model_dir: Path,
                                                                                      tmp_path: Path) -> None:
    from rlkit.trainer import recover

    data = write_pair_splits(tmp_path / "data", train=32, held_out=16)
    straight = _trial(tmp_path, "straight", "dpo", tiny_model_dir, data, lr=3e-3, epochs=2, batch=8)
    trial = _trial(tmp_path, "requeued", "dpo", tiny_model_dir, data, lr=3e-3, epochs=2, batch=8,
                   recover_mode="auto")
    first = _start("dpo", 2, trial, {"STOP_AT_2": "1"}, code=STOPPING_DPO)
    _run("dpo", 2, straight)
    _wait(first)
    progress = json.loads((trial / "progress.json").read_text())
    assert (progress["status"], progress["step"]) == ("requeue", 2), progress
    found = recover.latest_valid(recover.recover_root(trial))
    assert found is not None and found[0] == 2
    state = recover.LoopState.from_json((found[1] / recover.STATE).read_text()).algorithm
    assert state["data"]["epoch"] == 0 and state["data"]["rows_into_epoch"] == 16
    # rank 0's state holds the reference log-probs of both ranks' pairs of steps 1-2 (2 x 8 pairs)
    assert len(state["reference"]) == 16

    second = _wait(_start("dpo", 2, trial, code=STOPPING_DPO))
    assert "resuming after step 2 " in second[0]
    assert [m["step"] for m in _metrics(trial)] == list(range(1, 9))
    assert json.loads((trial / "progress.json").read_text())["status"] == "finished"
    before, after = _final_weights(straight), _final_weights(trial)
    assert set(after) == set(before)
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=f"{k} differs after the resume")

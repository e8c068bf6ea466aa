"""SFT end to end on the real dev Slurm cluster: configs/sft-cpu-demo.yaml (a 2-rank gloo FSDP trainer, no servers)
submitted through the real CLI on the digits SFT toy data (rlkit.tasks.digits_sft) with the tiny model.

One trial carries the learning test and the recovery test: its trainer SIGKILLs itself after step KILLED_AFTER (fault
point die_after_step, first run only) between recover checkpoints, so the job's in-allocation retry must resume from
the last checkpoint, redo the lost steps and still reach the same end. (That a resumed run ends with exactly the
weights of an uninterrupted one is proven without Slurm in tests/integration/test_sft_training.py.)

Why the assertions cannot pass by chance. The untrained tiny model puts about ln(512) = 6.2 nats on each target token
(a uniform guess over its vocabulary); the validation loss after the first epoch is already far below that and the
last one below the first (margins below, from measurements). Greedy completions of held-out prompts are checked to
be a space, digits and EOS: an untrained model picks one of 512 tokens per position, 10 of them digits, so even one
such completion by chance is unlikely, let alone all of them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ..conftest import CONFIGS, run_rlkit
from ..slurm_helpers import processes_mentioning, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1800)]
EXPERIMENT = "demo-sft"
STEPS_PER_EPOCH, EPOCHS = 16, 3  # the demo: 512 rows, batch_size 32
KILLED_AFTER, RECOVER_EVERY = 20, 8  # checkpoints after steps 8 and 16; the retry redoes 17..20
HELD_OUT = 64  # validation prompts completed greedily by the saved model: all of them (measured: 64 of 64)


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Build the toy data and a private model copy in tmp, submit the demo config, wait for the end."""
    from rlkit.tasks.digits_sft import write_sft_dataset

    root = tmp_path_factory.mktemp("sft-e2e")
    model = root / "tiny-model"
    shutil.copytree(tiny_model_dir, model)
    train, valid = write_sft_dataset(root)
    name, trial_name = f"{EXPERIMENT}/e2e", "e2e"
    env = {"RLKIT_HOME": str(root / "home")}
    overrides = [f"actor.path={model}", f"train_dataset.path={train}", f"valid_dataset.path={valid}",
                 f"cluster.fileroot={root}/fileroot", f"trial_name={trial_name}", "stats_logger.tensorboard.path=null",
                 f"recover.freq_steps={RECOVER_EVERY}",
                 f"launcher.trainer_env_vars=OMP_NUM_THREADS=1,RLKIT_FAULT_INJECT=die_after_step@{KILLED_AFTER}"]
    submitted = run_rlkit("submit", str(CONFIGS / "sft-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    state = wait_state(name, timeout=1200, env=env)
    trial = root / "fileroot" / EXPERIMENT / trial_name
    return {"state": state, "trial": trial, "model": model, "valid": valid,
            "status": run_rlkit("status", name, env=env).stdout,
            "log": run_rlkit("logs", name, "--step", "sft", "--lines", "400", env=env).stdout}


def _metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.train.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def test_sft_job_completes_and_its_validation_loss_falls(sft_run: dict[str, object]) -> None:
    trial = Path(str(sft_run["trial"]))
    assert sft_run["state"] == "COMPLETED", str(sft_run["log"])[-4000:]
    steps = STEPS_PER_EPOCH * EPOCHS
    metrics = _metrics(trial)
    assert [int(m["step"]) for m in metrics] == list(range(1, steps + 1)), "every step once, in order"
    evals = [(int(m["step"]), m["eval/loss"]) for m in metrics if "eval/loss" in m]
    assert [s for s, _ in evals] == [STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)]
    # the data helper measured the demo at 6.2 -> 1.1 nats per target token over its 3 epochs (one process); the
    # untrained loss is step 1's (before its update), about ln(512)
    untrained, first, last = metrics[0]["sft/loss"], evals[0][1], evals[-1][1]
    assert untrained > 5.0 and first < 0.5 * untrained and last < first - 0.15, (untrained, evals)
    assert metrics[-1]["sft/ppl"] > 1.0 and all(m["eval/ppl"] > 1.0 for m in metrics if "eval/ppl" in m)


def test_killed_trainer_is_retried_and_resumes_without_losing_a_step(sft_run: dict[str, object]) -> None:
    trial = Path(str(sft_run["trial"]))
    batch_log = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert re.search(r"step sft failed with exit code \d+ at trained step \d+; restarting it", batch_log), batch_log
    trainer_log = (trial / "logs" / "sft.log").read_text()
    before, _, after = trainer_log.partition(f"resuming after step {2 * RECOVER_EVERY} ")
    assert after, "the retried trainer must resume from the last checkpoint before the kill"
    assert f"rlkit train: step {KILLED_AFTER}/" in before and f"rlkit train: step {KILLED_AFTER + 1}/" not in before
    discarded = [json.loads(line)["step"] for line in (trial / "metrics.discarded.jsonl").read_text().splitlines()]
    assert discarded == list(range(2 * RECOVER_EVERY + 1, KILLED_AFTER + 1)), "the steps after the checkpoint redone"


def test_saved_model_completes_held_out_prompts_with_digits_then_eos(sft_run: dict[str, object]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trial = Path(str(sft_run["trial"]))
    names = sorted(p.name for p in (trial / "checkpoints").iterdir())
    assert names == ["final", *sorted(f"step{STEPS_PER_EPOCH * e}" for e in range(1, EPOCHS + 1))]  # freq_epochs 1
    final = trial / "checkpoints" / "final"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    eos = tokenizer.eos_token_id
    rows = [json.loads(line) for line in Path(str(sft_run["valid"])).read_text().splitlines()]
    assert len(rows) == HELD_OUT
    completions = []
    for row in rows:  # one at a time: no padding to get wrong
        ids = torch.tensor([tokenizer.encode(row["prompt"], add_special_tokens=False)])
        with torch.no_grad():
            out = model.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=eos, pad_token_id=eos)
        new = out[0, ids.shape[1]:].tolist()
        completions.append((row["prompt"], tokenizer.decode(new[:-1]) if new and new[-1] == eos else None, new))
    for prompt, text, new in completions:
        assert text is not None, f"{prompt!r}: no EOS after the answer: {new}"
        assert re.fullmatch(r" \d{1,3}", text), f"{prompt!r}: completion {text!r} is not a space and digits"


def test_status_shows_the_trial_done_and_nothing_is_left_running(sft_run: dict[str, object]) -> None:
    trial = Path(str(sft_run["trial"]))
    steps = STEPS_PER_EPOCH * EPOCHS
    status = str(sft_run["status"])
    assert "COMPLETED" in status and f"training step {steps}/{steps}" in status, status
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["status"] == "finished" and progress["epoch"] == EPOCHS
    assert progress["eval_loss"] == pytest.approx(_metrics(trial)[-1]["eval/loss"])
    assert processes_mentioning(str(sft_run["model"])) == []
    assert processes_mentioning(str(trial)) == []

"""A two-stage run end to end on the real dev Slurm cluster: configs/sft-grpo-cpu-demo.yaml submitted through the
real CLI as ONE `rlkit submit`: stage sft (a gloo FSDP trainer on one rank here, no servers, on the digits SFT toy
data of rlkit.tasks.digits_sft), then stage grpo (one vLLM server here, the demo's two being no more proof of the
hand-over, + a 2-rank trainer) starting from the sft stage's final model, its job waiting in Slurm for the first one
to succeed (afterok).

The sft stage carries the SFT tests too: learning, and recovery (its trainer SIGKILLs itself after step
KILLED_AFTER, fault point die_after_step, first run only, between recover checkpoints, so the job's in-allocation retry
must resume from the last checkpoint, redo the lost steps and still reach the same end; that a resumed run ends with
exactly the weights of an uninterrupted one is proven without Slurm in tests/integration/test_sft_training.py).

Why the assertions cannot pass by chance. The untrained tiny model puts about ln(512) = 6.2 nats on each target token
(a uniform guess over its vocabulary); the validation loss after the first epoch is already far below that and the
last one below the first (margins below, from measurements). Greedy completions of held-out prompts are checked to
be a space, digits and EOS: an untrained model picks one of 512 tokens per position, 10 of them digits, so even one
such completion by chance is unlikely, let alone all of them. The grpo stage's reward (the fraction of digit
characters in a completion, rlkit/tasks/digits.py) is about 0.02 for the untrained model (the GRPO demo's first
steps measure 0.024) and about 0.75 for the SFT model (" 123" then EOS): a first-step reward above GRPO_FIRST_REWARD
is only reachable if the grpo stage's servers and trainer both loaded the sft stage's model.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.slurm_helpers import processes_mentioning, status_row, wait_for, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(2400)]
EXPERIMENT = "demo-stages"
RUN = "e2e"
STEPS_PER_EPOCH, EPOCHS = 16, 3  # the demo: 512 rows, batch_size 32
KILLED_AFTER, RECOVER_EVERY = 20, 8  # checkpoints after steps 8 and 16; the retry redoes 17..20
HELD_OUT = 64  # validation prompts completed greedily by the saved model: all of them (measured: 64 of 64)
GRPO_STEPS = 4
# The sft stage on one rank, not the demo's two: its tests are about stages, learning and the retry of a trainer that
# died whole, never between ranks (two ranks train like one: test_sft_training.py; a retry of two ranks:
# test_recovery_retries.py), and each rank start costs ~10 CPU-s of imports. One rank takes the whole batch of 32.
SFT_ONE_RANK = ("stages.sft.allocation_mode=fsdp:d1",)
GRPO_FIRST_REWARD = 0.4  # untrained: ~0.02; from the sft model: ~0.75 (module docstring)


@pytest.fixture(scope="module")
def staged_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Build the toy data and a private model copy in tmp, submit the two-stage demo config, wait for both ends."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    root = tmp_path_factory.mktemp("stages-e2e")
    model = root / "tiny-model"
    shutil.copytree(tiny_model_dir, model)
    train, valid = write_sft_dataset(root)
    prompts = write_dataset(root / "digits.jsonl")
    env = {"RLKIT_HOME": str(root / "home")}
    overrides = [f"actor.path={model}", f"stages.sft.train_dataset.path={train}",
                 f"stages.sft.valid_dataset.path={valid}", f"stages.grpo.train_dataset.path={prompts}",
                 f"cluster.fileroot={root}/fileroot", f"trial_name={RUN}", "stats_logger.tensorboard.path=null",
                 f"stages.sft.recover.freq_steps={RECOVER_EVERY}", f"stages.grpo.total_train_steps={GRPO_STEPS}",
                 "stages.grpo.allocation_mode=vllm:d1+fsdp:d2", *SFT_ONE_RANK,
                 "stages.sft.launcher.trainer_env_vars=OMP_NUM_THREADS=1,"
                 f"RLKIT_FAULT_INJECT=die_after_step@{KILLED_AFTER}"]
    submitted = run_rlkit("submit", str(CONFIGS / "sft-grpo-cpu-demo.yaml"), *overrides, env=env)
    assert submitted.returncode == 0, submitted.stderr
    sft, grpo = f"{EXPERIMENT}/{RUN}_sft", f"{EXPERIMENT}/{RUN}_grpo"
    waiting = status_row(grpo, env)["state"]
    sft_state = wait_state(sft, timeout=1200, env=env)
    grpo_state = wait_state(grpo, timeout=1200, env=env)
    trials = root / "fileroot" / EXPERIMENT
    return {"state": sft_state, "grpo_state": grpo_state, "grpo_waiting": waiting, "submit": submitted.stdout,
            "trial": trials / f"{RUN}_sft", "grpo_trial": trials / f"{RUN}_grpo", "model": model, "valid": valid,
            "status": run_rlkit("status", sft, env=env).stdout,
            "run_status": run_rlkit("status", f"{EXPERIMENT}/{RUN}", env=env),
            "run_json": run_rlkit("status", f"{EXPERIMENT}/{RUN}", "--json", env=env),
            "resume": run_rlkit("resume", f"{EXPERIMENT}/{RUN}", env=env),
            "log": run_rlkit("logs", sft, "--step", "sft", "--lines", "400", env=env).stdout,
            "grpo_log": run_rlkit("logs", grpo, "--step", "trainer", "--lines", "400", env=env).stdout}


def _metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.trainer.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def test_sft_job_completes_and_its_validation_loss_falls(staged_run: dict[str, object]) -> None:
    trial = Path(str(staged_run["trial"]))
    assert staged_run["state"] == "COMPLETED", str(staged_run["log"])[-4000:]
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


def test_killed_trainer_is_retried_and_resumes_without_losing_a_step(staged_run: dict[str, object]) -> None:
    trial = Path(str(staged_run["trial"]))
    batch_log = next((trial / "logs").glob("slurm-*.out")).read_text()
    assert re.search(r"step sft failed with exit code \d+ at trained step \d+; restarting it", batch_log), batch_log
    trainer_log = (trial / "logs" / "sft.log").read_text()
    before, _, after = trainer_log.partition(f"resuming after step {2 * RECOVER_EVERY} ")
    assert after, "the retried trainer must resume from the last checkpoint before the kill"
    assert f"rlkit train: step {KILLED_AFTER}/" in before and f"rlkit train: step {KILLED_AFTER + 1}/" not in before
    discarded = [json.loads(line)["step"] for line in (trial / "metrics.discarded.jsonl").read_text().splitlines()]
    assert discarded == list(range(2 * RECOVER_EVERY + 1, KILLED_AFTER + 1)), "the steps after the checkpoint redone"


def test_saved_model_completes_held_out_prompts_with_digits_then_eos(staged_run: dict[str, object]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trial = Path(str(staged_run["trial"]))
    names = sorted(p.name for p in (trial / "checkpoints").iterdir())
    assert names == ["final", *sorted(f"step{STEPS_PER_EPOCH * e}" for e in range(1, EPOCHS + 1))]  # freq_epochs 1
    final = trial / "checkpoints" / "final"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    eos = tokenizer.eos_token_id
    rows = [json.loads(line) for line in Path(str(staged_run["valid"])).read_text().splitlines()]
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


def test_status_shows_the_trial_done_and_nothing_is_left_running(staged_run: dict[str, object]) -> None:
    trial = Path(str(staged_run["trial"]))
    steps = STEPS_PER_EPOCH * EPOCHS
    status = str(staged_run["status"])
    assert "COMPLETED" in status and f"training step {steps}/{steps}" in status, status
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["status"] == "finished" and progress["epoch"] == EPOCHS
    assert progress["eval_loss"] == pytest.approx(_metrics(trial)[-1]["eval/loss"])
    assert processes_mentioning(str(staged_run["model"])) == []
    assert processes_mentioning(str(trial)) == []
    assert processes_mentioning(str(staged_run["grpo_trial"])) == []



def test_grpo_stage_waited_for_the_sft_stage_and_started_from_its_model(staged_run: dict[str, object]) -> None:
    from rlkit.config.load import load_config

    sft, grpo = Path(str(staged_run["trial"])), Path(str(staged_run["grpo_trial"]))
    assert staged_run["grpo_state"] == "COMPLETED", str(staged_run["grpo_log"])[-4000:]
    sft_job = json.loads((sft / "manifest.json").read_text())["job_id"]
    grpo_attempts = json.loads((grpo / "manifest.json").read_text())["attempts"]
    assert [a.get("after_ok") for a in grpo_attempts] == [sft_job], "submitted afterok the sft stage's job"
    assert staged_run["grpo_waiting"] == "PENDING", "the grpo stage waits while the sft stage runs"
    config = load_config(grpo / "config.yaml")
    assert config.actor.path == str(sft / "checkpoints" / "final") and config.vllm.model == ""
    metrics = _metrics(grpo)
    assert [int(m["step"]) for m in metrics] == list(range(1, GRPO_STEPS + 1))
    first = metrics[0]["reward/mean"]
    assert first > GRPO_FIRST_REWARD, f"the grpo stage's first reward {first}: it did not start from the sft model"


def test_run_status_lists_the_stages_and_resume_has_nothing_left(staged_run: dict[str, object]) -> None:
    submitted = str(staged_run["submit"])
    assert f"{EXPERIMENT}/{RUN}: 2 stages" in submitted and "stage sft (sft)" in submitted, submitted
    table = staged_run["run_status"]
    assert table.returncode == 0 and "all finished" in table.stdout, table.stdout + table.stderr  # type: ignore[attr-defined]
    data = json.loads(staged_run["run_json"].stdout)  # type: ignore[attr-defined]
    assert [(s["stage"], s["type"], s["state"], s["final"]) for s in data["stages"]] == [
        ("sft", "sft", "COMPLETED", True), ("grpo", "grpo", "COMPLETED", True)]
    assert data["current_stage"] == ""
    resumed = staged_run["resume"]
    assert resumed.returncode == 2 and "every stage of" in resumed.stderr, resumed.stderr  # type: ignore[attr-defined]


def test_stopping_a_run_cancels_the_waiting_stage_and_resume_continues_from_the_unfinished_one(
        tiny_model_dir: Path, tmp_path: Path, staged_run: dict[str, object]) -> None:
    """A long sft stage is stopped while it runs: the grpo stage waiting for it is cancelled, the sft trainer
    checkpoints; `rlkit resume RUN` resumes the sft stage from that checkpoint and submits the grpo stage again,
    afterok the new sft job. (Runs after the module's run has ended: the cluster is free.)"""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    shutil.copytree(tiny_model_dir, tmp_path / "tiny-model")
    train, valid = write_sft_dataset(tmp_path)
    env = {"RLKIT_HOME": str(tmp_path / "home")}
    run, sft = f"{EXPERIMENT}/stopme", f"{EXPERIMENT}/stopme_sft"
    submitted = run_rlkit("submit", str(CONFIGS / "sft-grpo-cpu-demo.yaml"), f"actor.path={tmp_path / 'tiny-model'}",
                          f"stages.sft.train_dataset.path={train}", f"stages.sft.valid_dataset.path={valid}",
                          f"stages.grpo.train_dataset.path={write_dataset(tmp_path / 'digits.jsonl')}",
                          f"cluster.fileroot={tmp_path}/fileroot", "trial_name=stopme",
                          "stats_logger.tensorboard.path=null", "stages.sft.total_train_epochs=100",
                          "stages.sft.recover.freq_steps=4", "stages.sft.allocation_mode=fsdp:d1",  # one rank: stages
                          env=env)                                      # are what this test is about, not ranks
    assert submitted.returncode == 0, submitted.stderr
    trials = tmp_path / "fileroot" / EXPERIMENT
    try:
        wait_for(lambda: list((trials / "stopme_sft" / "recover").glob("step*")), "a recover checkpoint", 300)
        stopped = run_rlkit("stop", run, env=env, timeout=400)
        assert stopped.returncode == 0, stopped.stderr
        assert "cancelled stage grpo" in stopped.stdout and "stopped stage sft" in stopped.stdout, stopped.stdout
        detail = json.loads(run_rlkit("status", run, "--json", env=env).stdout)
        states = {s["stage"]: s["state"] for s in detail["stages"]}
        assert states == {"sft": "CANCELLED", "grpo": "CANCELLED"} and detail["current_stage"] == "sft", detail
        progress = json.loads((trials / "stopme_sft" / "progress.json").read_text())
        assert progress["status"] == "stopped", progress

        resumed = run_rlkit("resume", run, env=env)
        assert resumed.returncode == 0, resumed.stderr
        jobs = dict(re.findall(r"stage (\w+): .* as Slurm job (\d+)", resumed.stdout))
        assert "stage sft: resumed from its last checkpoint" in resumed.stdout, resumed.stdout
        assert "stage grpo: submitted again" in resumed.stdout, resumed.stdout
        grpo_attempts = json.loads((trials / "stopme_grpo" / "manifest.json").read_text())["attempts"]
        assert grpo_attempts[-1]["after_ok"] == jobs["sft"], (grpo_attempts, jobs)
        wait_for(lambda: f"resuming after step {progress['step']} " in _text(trials / "stopme_sft" / "logs" /
                                                                              "sft.log"), "the resumed sft stage", 300)
    finally:
        run_rlkit("stop", run, "--now", env=env)
    wait_state(sft, timeout=120, env=env)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""

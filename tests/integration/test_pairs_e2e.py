"""The trainer-only job types end to end on the real dev Slurm cluster: the CPU demo configs (configs/rw-cpu-demo.yaml,
configs/dpo-cpu-demo.yaml, configs/sft-cpu-demo.yaml, no servers) run by `rlkit demo rw`, `rlkit demo dpo` and
`rlkit demo sft` side by side, each on ONE gloo FSDP rank (the configs have two), rw and dpo on the digits
preference pairs (rlkit/tasks/digits_pairs.py) with held-out pairs as valid_dataset, sft on the digits SFT rows
(rlkit/tasks/digits_sft.py) with held-out prompts.

Why the assertions cannot pass by chance.
- rw: a reward model's held-out accuracy is the fraction of 64 held-out pairs (prompts never trained on) whose chosen
  answer scores higher. The untrained model (the same backbone with its seeded fresh head) spreads over 0.05..0.78
  across head seeds (rlkit/tasks/digits_pairs.py); the test asks for >= 0.9 and more than the very same untrained
  model, which it scores itself. The saved model must reload with its head and score as the job's last eval said.
- sft: the untrained model's loss is about ln 512 = 6.2 nats per target token (a uniform guess over the vocabulary);
  the held-out loss must end below a third of it and fall from the first epoch's evaluation to the last (the config
  says 6.2 -> 1.1), which a stalled run or one training on the wrong tokens cannot show.
- dpo: the held-out implicit reward margin beta * ((policy - reference) chosen - (policy - reference) rejected) is
  exactly 0 before training (the policy is the reference). The test asks for > 1.0 at the end (beta 0.1: 10 nats
  of summed log-prob moved towards chosen answers of prompts never trained on), rising from the first epoch's end
  to the second, with held-out accuracy >= 0.9.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_rlkit

pytestmark = [pytest.mark.slurm]
JOBS = ("rw", "dpo", "sft")
# One trainer rank each, not the configs' two: nothing here is between ranks (two ranks train like one:
# test_pair_training.py, test_sft_training.py), and each rank start costs ~10 CPU-s. One rank takes the whole batch.
ONE_RANK = ("allocation_mode=fsdp:d1",)


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, dict[str, object]]:
    """`rlkit demo rw`, `rlkit demo dpo` and `rlkit demo sft` side by side (one rank each: all three fit at once),
    as a user runs the examples: each prepares its model and data in its demo directory, submits, follows the job
    and prints its figures. The command is what is under test here; the trials are the same configs with only the
    allocation overridden (ONE_RANK), through the command's own overrides. Each demo directory starts with a copy of
    the session's tiny model, the one the demo builds (the same parameters), which the demo reuses as a second run of
    it would: building it costs each demo process ~10 CPU-s of torch and transformers imports, and the build is
    tested where it is the subject (tests/unit/cli/test_demos.py, from an empty directory)."""
    import shutil
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("pairs-e2e")
    demos: dict[str, subprocess.Popen[str]] = {}
    for job in JOBS:
        shutil.copytree(tiny_model_dir, root / f"demo-{job}" / "tiny-model")
        env = {**os.environ, "RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root / f"demo-{job}"),
               "RLKIT_DEMO_TRIAL": "e2e", "RLKIT_FILEROOT": str(root / "fileroot")}
        demos[job] = subprocess.Popen([sys.executable, "-m", "rlkit", "demo", job, *ONE_RANK], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    runs: dict[str, dict[str, object]] = {}
    for job, demo in demos.items():
        output = demo.communicate(timeout=1200)[0]
        name = f"demo-{job}/e2e"
        logs = run_rlkit("logs", name, "--lines", "300", env={"RLKIT_HOME": str(root / "home")}).stdout
        runs[job] = {"trial": root / "fileroot" / f"demo-{job}" / "e2e", "name": name, "rc": demo.returncode,
                     "output": output, "log": output + logs, "model": root / f"demo-{job}" / "tiny-model",
                     "held_out": root / f"demo-{job}" / "digits_pairs_heldout.jsonl"}
    return runs


def _demo_succeeded(run: dict[str, object]) -> None:
    """The demo command's own account: exit 0, the status it followed, the figures and where the results are."""
    output = str(run["output"])
    assert run["rc"] == 0, str(run["log"])[-4000:]
    assert f"-cpu-demo.yaml {' '.join(ONE_RANK)}\n" in output, output  # the overrides reached `rlkit submit`
    assert "\nallocation_mode: fsdp:d1\n" in (Path(str(run["trial"])) / "config.yaml").read_text()  # and the job
    assert f"$ rlkit status {run['name']}" in output and "COMPLETED" in output, output
    assert f"metrics per step in {run['trial']}/metrics.jsonl" in output, output


def _metrics(trial: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]


def _heldout_accuracy(model_dir: Path, tokenizer_dir: Path, held_out: Path) -> float:
    import torch
    from transformers import AutoTokenizer

    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import RWConfig
    from rlkit.jobs.pairs.batch import pack_pairs
    from rlkit.jobs.pairs.data import pairs_from_config
    from rlkit.jobs.pairs.loss_fns import rw_loss_fn
    from rlkit.models.value_model import load_value_model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    pairs, _ = pairs_from_config(DatasetConfig(path=str(held_out), max_length=64), RWConfig(), tokenizer)
    model = load_value_model(model_dir).eval()
    with torch.no_grad():
        _, _, stats = rw_loss_fn(model, pack_pairs(pairs, int(tokenizer.pad_token_id)))
    return stats["accuracy"]


def test_rw_ranks_heldout_pairs_above_the_untrained_model(demo_runs: dict[str, dict[str, object]]) -> None:
    run = demo_runs["rw"]
    trial = Path(str(run["trial"]))
    _demo_succeeded(run)
    metrics = _metrics(trial)
    assert [m["step"] for m in metrics] == list(range(1, 17))  # 256 pairs / 16 per step, one epoch
    assert all({"rw/loss", "rw/accuracy"} <= set(m) for m in metrics)
    model, held_out = Path(str(run["model"])), Path(str(run["held_out"]))
    untrained = _heldout_accuracy(model, model, held_out)
    trained = metrics[-1]["eval/accuracy"]
    assert trained >= 0.9 and trained > untrained, (trained, untrained)
    final = trial / "checkpoints" / "final"
    assert json.loads((final / "rlkit_value_head.json").read_text())["kind"] == "reward"
    assert abs(_heldout_accuracy(final, final, held_out) - trained) < 1e-6  # reloads with its trained head
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["status"] == "finished" and progress["eval"]["accuracy"] == trained
    evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    assert len(evals) == 1, evals  # one epoch, one evaluation: shown as one figure, not as a change from itself
    shown = f"demo rw: {run['name']}: 16 steps; held-out accuracy {trained:.3f} (one evaluation, at the end)"
    assert shown in str(run["output"]), run["output"]


def test_dpo_raises_the_heldout_chosen_over_rejected_margin(demo_runs: dict[str, dict[str, object]]) -> None:
    run = demo_runs["dpo"]
    trial = Path(str(run["trial"]))
    _demo_succeeded(run)
    metrics = _metrics(trial)
    assert [m["step"] for m in metrics] == list(range(1, 33))  # 16 steps per epoch, 2 epochs
    assert all({"dpo/loss", "dpo/reward_margin", "dpo/accuracy"} <= set(m) for m in metrics)
    evals = [m for m in metrics if "eval/reward_margin" in m]
    assert [m["step"] for m in evals] == [16, 32]
    assert evals[-1]["eval/reward_margin"] > 1.0 and evals[-1]["eval/accuracy"] >= 0.9, evals
    assert evals[-1]["eval/reward_margin"] > evals[0]["eval/reward_margin"] > 0, evals
    margins = f"held-out reward margin {evals[0]['eval/reward_margin']:.3f} -> {evals[-1]['eval/reward_margin']:.3f}"
    assert margins in str(run["output"]), run["output"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(trial / "checkpoints" / "final")  # the saver wrote a causal LM


def test_the_trained_reward_model_scores_grpo_completions_as_rw_ranked_them(
        demo_runs: dict[str, dict[str, object]], tmp_path: Path) -> None:
    """`reward.fn: reward_model` on rw's checkpoints/final, through the RewardRunner a GRPO trainer uses: each
    held-out (prompt, answer) scores what the rw model gives that sequence, and chosen answers beat rejected ones as
    often as the job's last evaluation said. The submit-time check takes this directory and refuses the base model
    and the dpo trial's causal LM."""
    import asyncio

    import torch
    from transformers import AutoTokenizer

    from rlkit.checks.reward_model import validate_reward_model
    from rlkit.config.load import config_from_mapping
    from rlkit.config.problems import Problems
    from rlkit.models.value_model import load_value_model, token_values
    from rlkit.rewards import resolve_reward_fn
    from rlkit.rewards.runner import RewardRunner

    run = demo_runs["rw"]
    final = Path(str(run["trial"])) / "checkpoints" / "final"
    rows = [json.loads(line) for line in Path(str(run["held_out"])).read_text().splitlines()]
    runner = RewardRunner(resolve_reward_fn("reward_model", "answer", str(final)), timeout=60, workers=1)

    async def score_all() -> list[tuple[float, float]]:
        out = []
        for row in rows:
            chosen = await runner.score(row["prompt"], row["chosen"], row)
            rejected = await runner.score(row["prompt"], row["rejected"], row)
            assert chosen.error is None and rejected.error is None, (chosen, rejected)
            out.append((chosen.value, rejected.value))
        return out

    try:
        scores = asyncio.run(score_all())
    finally:
        runner.close()
    accuracy = sum(c > r for c, r in scores) / len(scores)
    trained = _metrics(Path(str(run["trial"])))[-1]["eval/accuracy"]
    assert abs(accuracy - trained) < 1e-6, (accuracy, trained)

    tokenizer, model = AutoTokenizer.from_pretrained(final), load_value_model(final).eval()
    ids = tokenizer.encode(rows[0]["prompt"] + rows[0]["chosen"], add_special_tokens=False)
    prompt_len = len(tokenizer.encode(rows[0]["prompt"], add_special_tokens=False))
    ids = ids[:prompt_len] + tokenizer.encode(rows[0]["chosen"], add_special_tokens=False) + [tokenizer.eos_token_id]
    with torch.no_grad():
        direct = token_values(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0, -1].item()
    assert abs(direct - scores[0][0]) < 1e-4, (direct, scores[0][0])

    def problems_for(path: Path) -> list[str]:
        config = config_from_mapping({"experiment_name": "e", "trial_name": "t", "type": "grpo",
                                      "allocation_mode": "vllm:d1+fsdp:d1",
                                      "actor": {"path": str(run["model"])},
                                      "reward": {"fn": "reward_model", "reward_model_path": str(path)}})
        problems = Problems()
        validate_reward_model(config, problems)
        return [e.message for e in problems.errors]

    assert problems_for(final) == []
    assert "is neither a reward model written by job type rw (no rlkit_value_head.json) nor a Hugging Face " \
           "sequence classifier" in problems_for(Path(str(run["model"])))[0]
    dpo_final = Path(str(demo_runs["dpo"]["trial"])) / "checkpoints" / "final"
    assert "is neither a reward model written by job type rw" in problems_for(dpo_final)[0]
    assert "is not a directory" in problems_for(tmp_path / "nothing")[0]


def test_sft_demo_learns_the_answer_format_on_held_out_prompts(demo_runs: dict[str, dict[str, object]]) -> None:
    run = demo_runs["sft"]
    _demo_succeeded(run)
    metrics = _metrics(Path(str(run["trial"])))
    assert [int(m["step"]) for m in metrics] == list(range(1, 49)), "3 epochs of 16 steps"
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    untrained = metrics[0]["sft/loss"]
    assert untrained > 5.0 and len(evals) >= 2, (untrained, evals)
    assert evals[-1] < evals[0] and evals[-1] < untrained / 3, (untrained, evals)
    assert f"held-out loss {evals[0]:.3f} -> {evals[-1]:.3f}" in str(run["output"]), run["output"]

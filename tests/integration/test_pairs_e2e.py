"""Job types rw and dpo end to end on the real dev Slurm cluster: the CPU demo configs (configs/rw-cpu-demo.yaml,
configs/dpo-cpu-demo.yaml, a 2-rank gloo FSDP trainer each, no servers) submitted through the real CLI side by side,
on the digits preference pairs (rlkit/tasks/digits_pairs.py) with held-out pairs as valid_dataset.

Why the assertions cannot pass by chance.
- rw: a reward model's held-out accuracy is the fraction of 64 held-out pairs (prompts never trained on) whose chosen
  answer scores higher. The untrained model (the same backbone with its seeded fresh head) spreads over 0.05..0.78
  across head seeds (rlkit/tasks/digits_pairs.py); the test asks for >= 0.9 and more than the very same untrained
  model, which it scores itself. The saved model must reload with its head and score as the job's last eval said.
- dpo: the held-out implicit reward margin beta * ((policy - reference) chosen - (policy - reference) rejected) is
  exactly 0 before training (the policy is the reference). The test asks for > 1.0 at the end (beta 0.1: 10 nats
  of summed log-prob moved towards chosen answers of prompts never trained on), rising from the first epoch's end
  to the second, with held-out accuracy >= 0.9.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.slurm_helpers import wait_state

pytestmark = [pytest.mark.slurm]
JOBS = ("rw", "dpo")


@pytest.fixture(scope="module")
def pair_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Submit both demos at once (2 nodes each on the 4-node cluster), then wait for both."""
    from rlkit.tasks.digits_pairs import write_pair_splits

    root = tmp_path_factory.mktemp("pairs-e2e")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)  # a private copy identifies this run's processes
    train, held_out = write_pair_splits(root / "data")
    runs: dict[str, dict[str, object]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLKIT_HOME", str(root / "home"))
        for job in JOBS:
            overrides = [f"actor.path={model}", f"train_dataset.path={train}", f"valid_dataset.path={held_out}",
                         f"cluster.fileroot={root}/fileroot", "trial_name=e2e"]
            submitted = run_rlkit("submit", str(CONFIGS / f"{job}-cpu-demo.yaml"), *overrides)
            assert submitted.returncode == 0, submitted.stderr
            runs[job] = {"trial": root / "fileroot" / f"demo-{job}" / "e2e", "name": f"demo-{job}/e2e"}
        for run in runs.values():
            run["state"] = wait_state(str(run["name"]), timeout=900)
            run["log"] = run_rlkit("logs", str(run["name"]), "--lines", "300").stdout
    for run in runs.values():
        run.update(model=model, held_out=held_out)
    return runs


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


def test_rw_ranks_heldout_pairs_above_the_untrained_model(pair_runs: dict[str, dict[str, object]]) -> None:
    run = pair_runs["rw"]
    trial = Path(str(run["trial"]))
    assert run["state"] == "COMPLETED", str(run["log"])[-4000:]
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


def test_dpo_raises_the_heldout_chosen_over_rejected_margin(pair_runs: dict[str, dict[str, object]]) -> None:
    run = pair_runs["dpo"]
    trial = Path(str(run["trial"]))
    assert run["state"] == "COMPLETED", str(run["log"])[-4000:]
    metrics = _metrics(trial)
    assert [m["step"] for m in metrics] == list(range(1, 33))  # 16 steps per epoch, 2 epochs
    assert all({"dpo/loss", "dpo/reward_margin", "dpo/accuracy"} <= set(m) for m in metrics)
    evals = [m for m in metrics if "eval/reward_margin" in m]
    assert [m["step"] for m in evals] == [16, 32]
    assert evals[-1]["eval/reward_margin"] > 1.0 and evals[-1]["eval/accuracy"] >= 0.9, evals
    assert evals[-1]["eval/reward_margin"] > evals[0]["eval/reward_margin"] > 0, evals
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(trial / "checkpoints" / "final")  # the saver wrote a causal LM


def test_the_trained_reward_model_scores_grpo_completions_as_rw_ranked_them(
        pair_runs: dict[str, dict[str, object]], tmp_path: Path) -> None:
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

    run = pair_runs["rw"]
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
    assert "is not a reward model written by job type rw (no rlkit_value_head.json)" in problems_for(
        Path(str(run["model"])))[0]
    dpo_final = Path(str(pair_runs["dpo"]["trial"])) / "checkpoints" / "final"
    assert "is not a reward model written by job type rw" in problems_for(dpo_final)[0]
    assert "is not a directory" in problems_for(tmp_path / "nothing")[0]

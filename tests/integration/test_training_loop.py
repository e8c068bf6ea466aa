"""The training loop (rlkit.trainer.loop) with a second algorithm than GRPO: a next-token toy on the tiny model.

The toy is trainer-only (no servers), like SFT will be: it proves that the loop's protocol carries an algorithm that is
not GRPO through real torch.distributed (gloo, CPU) ranks. A run asked to stop by USR1 (Slurm's time-limit warning)
checkpoints its engine by name and its own state, reports "requeue", and the next run resumes it: the steps run once
each, and the final model equals the one of a run that was never interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlkit.trainer import recover
from tests.helpers.gloo_ranks import run_ranks

WORKER = r'''
import os, signal, sys, torch
from pathlib import Path
from rlkit.config.load import load_config
from rlkit.trainer.dist import end_process
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer.loop import LoopContext, StepResult, run_training


class NextTokenToy:
    """Each step: 4 seeded token rows (the step's "data"), dealt out over the ranks, one optimizer step of the
    next-token loss; its state is the list of steps it trained."""

    def __init__(self, ctx: LoopContext) -> None:
        self.rank, self.world = ctx.env.rank, ctx.env.world_size
        self.engine = TrainEngine(ctx.config.actor, rank=self.rank, world=self.world, device=ctx.device,
                                  total_optimizer_steps=4)
        self.engines = {"actor": self.engine}
        self.total_steps = 4
        self.seen: list[int] = []

    def start(self, resumed):
        self.seen = list(resumed["seen"]) if resumed is not None else []
        print(f"toy start seen={self.seen}", flush=True)

    def step(self, step):
        ids = torch.randint(5, 500, (4, 8), generator=torch.Generator().manual_seed(step))[self.rank::self.world]
        losses = []

        def loss_fn(model, mb):
            logits = model(input_ids=mb, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mb[:, 1:].reshape(-1))
            losses.append(float(loss.detach()))
            return loss, mb[:, 1:].numel()

        stats = self.engine.optimizer_step([ids], loss_fn, ids[:, 1:].numel())
        self.seen.append(step)
        if os.environ.get("TOY_USR1_AT") == str(step) and self.rank == 0:
            os.kill(os.getpid(), signal.SIGUSR1)  # as Slurm warns of the time limit
        return StepResult({"toy/loss": losses[0], **stats} if self.rank == 0 else {})

    def epoch(self, step):
        return step // 2

    def state(self, step):
        return {"seen": self.seen}

    def progress(self):
        return {"seen": len(self.seen)}

    def summary(self, metrics):
        return f"loss {metrics['toy/loss']:.3f}"

    def finish(self):
        print("toy finished", flush=True)

    def abort(self, exc):
        pass

    def close(self):
        pass


trial = Path(sys.argv[1])
run_training(trial, load_config(trial / "config.yaml"), NextTokenToy)
end_process(0)
'''


def _run(world: int, trial: Path, extra_env: dict[str, str] | None = None) -> list[str]:
    return run_ranks(world, ["-c", WORKER, str(trial)], extra_env)


def _trial(tmp_path: Path, name: str, model: Path, recover_mode: str) -> Path:
    trial = tmp_path / name
    trial.mkdir()
    config = {"experiment_name": "loop", "trial_name": name, "type": "grpo", "allocation_mode": "fsdp:d1",
              "actor": {"path": str(model), "dtype": "float32", "attn_impl": "sdpa",
                        "optimizer": {"type": "sgd", "lr": 0.5, "weight_decay": 0.0, "warmup_steps_proportion": 0.0}},
              "recover": {"mode": recover_mode, "freq_steps": None, "freq_secs": None}}
    (trial / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    return trial


def _final_weights(trial: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((trial / "checkpoints" / "final").glob("*.safetensors"))))


def test_a_requeued_run_resumes_its_engine_and_state_and_ends_like_a_straight_run(tiny_model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    straight = _trial(tmp_path, "straight", tiny_model_dir, "disabled")
    _run(2, straight)
    assert json.loads((straight / "progress.json").read_text())["status"] == "finished"

    trial = _trial(tmp_path, "requeued", tiny_model_dir, "auto")
    first = _run(2, trial, {"TOY_USR1_AT": "2"})
    progress = json.loads((trial / "progress.json").read_text())
    assert (progress["status"], progress["step"], progress["seen"]) == ("requeue", 2, 2), progress
    assert "got SIGUSR1" in first[0] and "toy finished" not in first[0]
    found = recover.latest_valid(recover.recover_root(trial))
    assert found is not None and found[0] == 2
    state = recover.LoopState.from_json((found[1] / recover.STATE).read_text())
    assert state.engines == {"actor": 2} and state.algorithm == {"seen": [1, 2]}
    assert recover.shards_dir(found[1], "actor").is_dir()

    second = _run(2, trial)
    assert "resuming after step 2 " in second[0] and "toy start seen=[1, 2]" in second[0]
    assert "toy start seen=[1, 2]" in second[1]  # every rank gets the algorithm's state
    progress = json.loads((trial / "progress.json").read_text())
    assert (progress["status"], progress["step"], progress["seen"]) == ("finished", 4, 4), progress
    steps = [json.loads(line)["step"] for line in (trial / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]

    before = _final_weights(straight)
    from safetensors.torch import load_file

    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = max(float((before[k] - initial[k]).abs().max()) for k in initial if k in before)
    assert moved > 1e-3, "training did not change the weights; the comparison below would prove nothing"
    after = _final_weights(trial)
    assert set(after) == set(before)
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=f"{k} differs after the resume")


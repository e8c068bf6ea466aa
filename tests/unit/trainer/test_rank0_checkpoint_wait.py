"""While trainer rank 0 alone writes a checkpoint (the saver's export after a step, a recover checkpoint's seal and
pruning), the other ranks wait for it in its broadcast group for as long as saver.write_timeout allows, not in a
collective of the process group, whose default timeout (30 minutes) a 70B export to a shared filesystem outlasts and
whose error names nothing; past that bound they end naming what rank 0 was writing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.trainer import dist as rdist
from rlkit.trainer.loop import Loop, StepResult
from rlkit.trainer.loop_rank0 import LoopRank0
from rlkit.trials.paths import TrialPaths

slow, trial, wait = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
# the process group's default timeout (30 s here) is longer than the bound: a rank that ends at the bound ended there
env, _ = rdist.init_distributed(None, timeout_s=30.0, rank0_wait_s=wait)

class Engine:
    optimizer_steps, skipped = 0, SimpleNamespace(take=lambda: (0, 0))
    def full_state_dict(self):
        return {}
    def save_sharded(self, directory):
        return {}

class Algorithm:
    engines, total_steps = {"actor": Engine()}, 2
    def start(self, resumed): pass
    def step(self, step): return StepResult({"loss": 1.0})
    def epoch(self, step): return 1
    def state(self, step): return {}
    def progress(self): return {}
    def summary(self, metrics): return ""
    def finish(self): pass
    def abort(self, exc): pass
    def close(self): pass

def slowly(*args, **kwargs):  # rank 0 writing to a slow filesystem
    time.sleep(1.5)

config = ExperimentConfig(experiment_name="e", trial_name="t", type="sft", allocation_mode="fsdp:d2")
config.recover.freq_secs = None
if slow == "export":
    LoopRank0.export = slowly
    config.saver.freq_steps = 1
else:
    LoopRank0.write_recover = slowly
    config.recover.freq_steps = 1
Loop(config, TrialPaths(trial / str(env.rank)), Algorithm(), None, rank0=env.rank == 0,
     stop=SimpleNamespace(requested=None)).run()
print("finished", flush=True)
rdist.end_process(0)
"""


def run(tmp_path: Path, slow: str, wait: float) -> tuple[str, str, int | None]:
    """Rank 0's output, rank 1's output and exit code (rank 0 is killed if it still runs once rank 1 ended)."""
    from tests.helpers.gloo_ranks import start_ranks

    rank0, rank1 = start_ranks(2, ["-c", SCRIPT, slow, str(tmp_path), str(wait)])
    try:
        out1 = rank1.communicate(timeout=60)[0]
    finally:
        try:
            rank0.communicate(timeout=10 if rank1.returncode == 0 else 0.1)
        except subprocess.TimeoutExpired:
            rank0.kill()
    return rank0.communicate()[0], out1, rank1.returncode


@pytest.mark.parametrize(("slow", "doing"), [
    ("export", "write checkpoints/step1 (the save of step 1)"),
    ("recover", "seal the recover checkpoint of step 1 in "),
])
def test_the_other_ranks_name_what_rank_0_was_writing_when_its_bound_passes(tmp_path: Path, slow: str,
                                                                           doing: str) -> None:
    _, out1, code = run(tmp_path, slow, 1.0)
    assert code == 1, out1
    assert f"rank 1: waited 1 s for trainer rank 0 to {doing}" in out1, out1
    assert "saver.write_timeout" in out1


def test_a_slow_export_within_the_bound_is_waited_for(tmp_path: Path) -> None:
    out0, out1, code = run(tmp_path, "export", 20.0)
    assert code == 0 and "finished" in out1 and "finished" in out0, (out0, out1)


def test_the_bound_is_at_least_two_checkpoint_writes() -> None:
    """Every job type's wait for rank 0 covers the last step's save and checkpoints/final, from saver.write_timeout
    (grpo's own rank0_wait_bound when longer: run_training takes the longer of the two)."""
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.trainer.loop_rank0 import checkpoint_wait_s

    config = ExperimentConfig(experiment_name="e", trial_name="t", type="sft", allocation_mode="fsdp:d2")
    config.saver.write_timeout = 5000.0
    assert checkpoint_wait_s(config) >= 2 * 5000.0

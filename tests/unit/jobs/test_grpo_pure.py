"""The pure parts of the GRPO loop: number of steps, weight-check tolerance, when checkpoints are saved."""

from __future__ import annotations

from typing import Any

import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.jobs.grpo.algorithm import total_steps
from rlkit.jobs.grpo.rank0 import Rank0, weight_check_tolerance
from rlkit.servers.guard_check import GuardCheckFailed
from rlkit.servers.pool import ServersUnreachable
from rlkit.trainer.loop import StepFailed
from rlkit.trainer.loop_rank0 import Saver

BASE: dict[str, Any] = {"experiment_name": "exp", "trial_name": "t1", "type": "grpo",
                        "allocation_mode": "vllm:d1+fsdp:d1"}


def config(*overrides: str) -> ExperimentConfig:
    """A typed config built the way load_config builds one (schema + mapping + dotlist overrides)."""
    return config_from_mapping(dict(BASE), list(overrides), source="test")


# --- total_steps ------------------------------------------------------------------------------------------------

def test_total_steps_is_epochs_times_full_batches() -> None:
    cfg = config("train_dataset.batch_size=4", "total_train_epochs=3")
    assert total_steps(cfg, 10) == 6  # 10 // 4 = 2 per epoch (partial batch dropped), 3 epochs
    assert total_steps(cfg, 12) == 9
    assert total_steps(cfg, 3) == 0


def test_total_train_steps_caps_the_epochs() -> None:
    assert total_steps(config("train_dataset.batch_size=4", "total_train_epochs=3", "total_train_steps=5"), 10) == 5
    # a cap above what the epochs give changes nothing
    assert total_steps(config("train_dataset.batch_size=4", "total_train_epochs=3", "total_train_steps=50"), 10) == 6


def test_total_train_steps_alone_when_the_dataset_gives_no_full_batch() -> None:
    assert total_steps(config("train_dataset.batch_size=8", "total_train_steps=7"), 5) == 7
    assert total_steps(config("train_dataset.batch_size=8", "total_train_steps=7"), 0) == 7


def test_direct_dataclass_construction_agrees() -> None:
    cfg = ExperimentConfig(experiment_name="exp", trial_name="t1", allocation_mode="vllm:d1+fsdp:d1",
                           total_train_epochs=2)
    cfg.train_dataset.batch_size = 3
    assert total_steps(cfg, 10) == 6


# --- weight_check_tolerance -------------------------------------------------------------------------------------

def test_explicit_tolerance_wins() -> None:
    assert weight_check_tolerance(config("actor.weight_check_tolerance=0.02")) == 0.02
    assert weight_check_tolerance(config("actor.weight_check_tolerance=0.5", "vllm.dtype=float32",
                                         "actor.dtype=float32")) == 0.5


def test_float32_on_both_sides_is_tight() -> None:
    assert weight_check_tolerance(config("vllm.dtype=float32", "actor.dtype=float32")) == 1e-3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_same_16_bit_dtype_on_both_sides_is_loose(dtype: str) -> None:
    assert weight_check_tolerance(config(f"vllm.dtype={dtype}", f"actor.dtype={dtype}")) == 0.1


@pytest.mark.parametrize(("vllm", "actor"), [("float32", "bfloat16"), ("bfloat16", "float32"),
                                             ("float16", "float32"), ("float16", "bfloat16")])
def test_different_dtypes_on_the_two_sides_are_looser_still(vllm: str, actor: str) -> None:
    # a bf16 trainer against a float32 server of its bf16 export: 0.095-0.098 mean on an H200 (bench/bench_gpu.py)
    assert weight_check_tolerance(config(f"vllm.dtype={vllm}", f"actor.dtype={actor}")) == 0.3


# --- Saver.due --------------------------------------------------------------------------------------------------

def test_saver_freq_steps() -> None:
    saver = Saver(freq_steps=3, freq_epochs=None, freq_secs=None, last_time=0.0)
    assert [step for step in range(1, 10) if saver.due(step, 0, now=float(step))] == [3, 6, 9]


def test_saver_freq_epochs_only_when_the_epoch_advances() -> None:
    saver = Saver(freq_steps=None, freq_epochs=1, freq_secs=None, last_time=0.0)
    # (step, epoch): epoch 1 is reached at step 3 and stays 1 for steps 4, 5; epoch 2 at step 6
    seen = [(step, epoch) for step, epoch in [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2)]
            if saver.due(step, epoch, now=0.0)]
    assert seen == [(3, 1), (6, 2)]


def test_saver_freq_epochs_every_second_epoch() -> None:
    saver = Saver(freq_steps=None, freq_epochs=2, freq_secs=None, last_time=0.0)
    seen = [epoch for epoch in [0, 1, 1, 2, 2, 3, 4, 4] if saver.due(10, epoch, now=0.0)]
    assert seen == [2, 4]


def test_saver_freq_secs_with_a_fake_clock() -> None:
    saver = Saver(freq_steps=None, freq_epochs=None, freq_secs=60, last_time=1000.0)
    assert not saver.due(1, 0, now=1059.9)
    assert saver.due(2, 0, now=1060.0)
    assert saver.last_time == 1060.0
    assert not saver.due(3, 0, now=1100.0)  # counted from the last save, not from the start
    assert saver.due(4, 0, now=1120.0)


def test_saver_any_save_resets_the_clock() -> None:
    saver = Saver(freq_steps=5, freq_epochs=None, freq_secs=60, last_time=0.0)
    assert saver.due(5, 0, now=50.0)  # the step rule fires and restarts the 60 s
    assert not saver.due(6, 0, now=100.0)
    assert saver.due(7, 0, now=110.0)


def test_saver_off_never_saves() -> None:
    saver = Saver(freq_steps=None, freq_epochs=None, freq_secs=None, last_time=0.0)
    assert not any(saver.due(step, step, now=1e9) for step in range(1, 20))


# --- Rank0.abort: rank 0's own error, with the checkpoint the loop saved before failing ----------------------------

class _Stopped:
    """The part of a Rank0 that abort reads: the error met while getting the batch, and close."""

    def __init__(self, error: BaseException) -> None:
        self._pending_error = error
        self.closed = False

    def close(self) -> None:
        self.closed = True


NOTE = "; checkpointed step 7, the trainer's retry resumes from it"  # as the failure message ends


@pytest.mark.parametrize("kind", [ServersUnreachable, GuardCheckFailed])
def test_a_one_rank_failure_keeps_its_own_type_and_says_which_checkpoint_was_saved(kind: type[StepError]) -> None:
    """With one rank no other rank prints the shared message: rank 0's own error must carry the note, and keep the
    type that decides the job's retry (a FatalStepError's exit code)."""
    error = kind("no inference server accepts connections (4 attempts)")
    rank0 = _Stopped(error)
    with pytest.raises(kind) as raised:
        Rank0.abort(rank0, StepFailed(str(error), NOTE.removeprefix("; ")))  # type: ignore[arg-type]
    assert raised.value is error and raised.value.exit_code == kind.exit_code and rank0.closed
    assert str(raised.value) == "no inference server accepts connections (4 attempts)" + NOTE


def test_a_bug_on_rank_0_keeps_its_traceback_and_notes_the_checkpoint() -> None:
    bug = KeyError("prompt")
    with pytest.raises(KeyError) as raised:
        Rank0.abort(_Stopped(bug), StepFailed("trainer rank 0 failed: KeyError: 'prompt'", NOTE.removeprefix("; ")))  # type: ignore[arg-type]
    assert raised.value is bug and raised.value.__notes__ == [NOTE.removeprefix("; ")]

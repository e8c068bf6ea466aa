"""Files a resume reads back, when they are not what rlkit wrote: a recover checkpoint's trainer_state.json and a rank
file's header. Each is a StepError naming the file (a damaged rank file: DamagedCheckpoint, so the resume takes the
previous checkpoint), never a RecursionError or TypeError traceback; a trainer state says whether it is damaged (not
JSON, which every rlkit writes) or of another shape (an older rlkit's), instead of always blaming an older rlkit."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlkit.errors import StepError
from rlkit.trainer import recover
from rlkit.trainer.loop import _load_checkpoint
from rlkit.trainer.rank_files import DamagedCheckpoint, read_header

DEEP = "[" * 200_000  # deeper than json.loads follows: a RecursionError before


def _load(directory: Path, state: str | bytes) -> Any:
    directory.mkdir(exist_ok=True)
    path = directory / recover.STATE
    path.write_bytes(state.encode() if isinstance(state, str) else state)
    return _load_checkpoint(directory, 3, SimpleNamespace(engines={}), announce=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", [DEEP, b"\xff\xfe\x00garbage", '{"step": 3, "engi'])
def test_a_state_file_that_is_not_json_is_called_damaged(tmp_path: Path, state: str | bytes) -> None:
    with pytest.raises(StepError) as caught:
        _load(tmp_path / "step-00000003", state)
    message = str(caught.value)
    assert f"{tmp_path / 'step-00000003' / recover.STATE} is damaged: it is not JSON" in message, message
    assert f"remove {tmp_path / 'step-00000003'} to resume from the checkpoint before it" in message
    assert "older rlkit" not in message


@pytest.mark.parametrize(("state", "why"), [
    ("[1, 2]", "a JSON list, not an object"),
    ('{"step": 3, "optimizer_steps": 7}', "unknown fields optimizer_steps"),
    ('{"step": "3"}', "step '3' is not a whole number"),
    ('{"step": 3, "engines": {"actor": "x"}}', "engines {'actor': 'x'} is not a table of optimizer steps"),
    ('{"step": 3, "engines": {}, "rng": []}', "rng is not an object"),
])
def test_a_state_file_of_another_shape_names_the_file_and_both_causes(tmp_path: Path, state: str, why: str) -> None:
    with pytest.raises(StepError) as caught:
        _load(tmp_path, state)
    message = str(caught.value)
    assert f"{tmp_path / recover.STATE} is not a trainer state this rlkit reads ({why})" in message, message
    assert "an older rlkit wrote it, or it was altered" in message


def test_rng_states_that_cannot_be_restored_are_a_step_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(StepError, match=rf"{recover.STATE} holds RNG states this rlkit cannot restore"):
        _load(tmp_path, json.dumps({"step": 3, "engines": {}, "rng": {"python": 5}}))


def test_a_state_file_this_rlkit_wrote_loads(tmp_path: Path) -> None:
    state = recover.LoopState(step=3, engines={}, algorithm={"version": 2}, rng=recover.rng_state(), saved_at=1.5)
    loaded = _load(tmp_path, state.to_json())
    assert (loaded.step, loaded.engines, loaded.algorithm, loaded.saved_at) == (3, {}, {"version": 2}, 1.5)


def _rank_file(path: Path, header: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@pytest.mark.parametrize("header", [
    DEEP.encode(),
    json.dumps({"__metadata__": {"rlkit": DEEP}}).encode(),
    json.dumps({"__metadata__": {"rlkit": 5}}).encode(),
])
def test_a_rank_file_header_nested_too_deep_is_a_damaged_checkpoint(tmp_path: Path, header: bytes) -> None:
    path = _rank_file(tmp_path / "rank-00000-of-00001.safetensors", header)
    with pytest.raises(DamagedCheckpoint, match=r"rank-00000-of-00001\.safetensors has no readable header"):
        read_header(path)

"""JSON nested deeper than Python's stack, in each file or record rlkit reads that others could have written: every
reader answers as it does for any malformed JSON (None, {}, a named problem), never with a RecursionError that would
reach the user as a traceback (rlkit.untrusted_json)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rlkit import untrusted_json
from rlkit.checks.model_modules import tensor_names
from rlkit.checks.reward_model import _json as reward_model_json
from rlkit.checks.site_files import check_chat_template
from rlkit.checks.token_tables import _token_table
from rlkit.cli.status import _last_loss
from rlkit.config.model_config import read_model_config
from rlkit.data.dataset_rows import first_jsonl_rows
from rlkit.errors import ConfigError
from rlkit.nameresolve.records import RawRecord, record_problem
from rlkit.nameresolve.servers import parse_server_record
from rlkit.trials.records import list_trials, read_json_dict
from rlkit.trials.recover_layout import manifest_digests

DEEP = "[" * 200_000 + "]" * 200_000  # json.loads alone: RecursionError


def test_the_reader_turns_depth_into_a_value_error() -> None:
    with pytest.raises(RecursionError):
        __import__("json").loads(DEEP)
    with pytest.raises(ValueError, match="nested deeper"):
        untrusted_json.loads(DEEP)
    assert untrusted_json.loads(b'{"a": [1]}') == {"a": [1]}


def test_every_reader_answers_as_for_malformed_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(DEEP)
    (model / "tokenizer_config.json").write_text(DEEP)
    header = DEEP.encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert read_model_config(str(model)) is None
    assert tensor_names(str(model)) is None
    (model / "model.safetensors.index.json").write_text(DEEP)
    assert tensor_names(str(model)) is None
    with pytest.raises(ConfigError, match="chat template"):  # as for a tokenizer_config.json that is not JSON
        check_chat_template("actor.path", str(model), "grpo renders chats")
    assert reward_model_json(deep) == {} and read_json_dict(deep) == {}
    assert _token_table("tokenizer.json", DEEP.encode()) is None
    assert _last_loss(deep) is None
    assert record_problem(RawRecord(str(deep), DEEP.encode())) == (None, "it is not a JSON record")
    with pytest.raises(ValueError, match="not JSON"):
        parse_server_record(DEEP)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "MANIFEST.json").write_text(DEEP)
    assert manifest_digests(tmp_path / "ckpt") == {}
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a"}\n' + DEEP + "\n")
    with pytest.raises(ConfigError, match=r"line 2 of .* is not JSON"):
        first_jsonl_rows("train_dataset.path", rows, 2)
    home = tmp_path / "rlkit-home"
    (home / "trials" / "exp").mkdir(parents=True)
    (home / "trials" / "exp" / "trial.json").write_text(DEEP)
    monkeypatch.setenv("RLKIT_HOME", str(home))
    assert list_trials() == []

"""A Parquet dataset's columns are checked at submit as a JSON Lines dataset's are (rlkit.data.dataset_head): a wrong
prompt_key, answer key, pair or sft column is refused naming the dataset's columns, read from the schema (row values
only where a check needs them); without pyarrow on the login node the columns are left to the job."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.config.load import config_from_mapping, load_config
from rlkit.data.dataset_head import dataset_head
from rlkit.jobs.validate import validate

NO_IMAGES = {"launcher": {"slurm": {"container_type": "none"}}}  # no image to name: only the dataset's problems


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _errors(config: Any) -> list[str]:
    """Every problem `rlkit submit` finds in `config` before it plans anything."""
    return [str(e) for e in validate(config).problems.errors]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return _parquet(tmp_path / "train.parquet", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)])


def test_a_wrong_prompt_key_of_a_parquet_dataset_is_refused_at_submit_naming_its_columns(
        grpo_yaml: Path, prompts: Path) -> None:
    assert _errors(load_config(grpo_yaml, [f"train_dataset.path={prompts}"])) == []
    found = _errors(load_config(grpo_yaml, [f"train_dataset.path={prompts}", "train_dataset.prompt_key=question"]))
    assert found == ["train_dataset.path: rows have no column 'question' (columns: prompt, answer)\n"
                     "  fix: set train_dataset.prompt_key to the prompt column"]
    found = _errors(load_config(grpo_yaml, [f"train_dataset.path={prompts}", "reward.answer_key=solution"]))
    assert len(found) == 1 and "needs the answer column 'solution'" in found[0]
    assert "(columns: prompt, answer)" in found[0]


def test_the_validation_set_and_a_directory_of_shards_are_checked_by_the_first_file(grpo_yaml: Path, prompts: Path,
                                                                                     tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    _parquet(shards / "part-0.parquet", [{"text": "1+1=", "answer": "2"}])
    _parquet(shards / "part-1.parquet", [{"prompt": "1+1=", "answer": "2"}])
    valid = ["evaluator.freq_steps=1", f"train_dataset.path={prompts}"]
    found = _errors(load_config(grpo_yaml, [*valid, f"valid_dataset.path={shards}"]))
    assert len(found) == 1 and found[0].startswith("valid_dataset.path: rows have no column 'prompt' (columns: "
                                                   "text, answer)")
    assert _errors(load_config(grpo_yaml, [*valid, f"valid_dataset.path={prompts}"])) == []


def test_gsm8k_rows_in_parquet_are_read_as_gsm8k_by_their_first_row(grpo_yaml: Path, tmp_path: Path) -> None:
    gsm8k = _parquet(tmp_path / "gsm8k.parquet", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    assert _errors(load_config(grpo_yaml, [f"train_dataset.path={gsm8k}"])) == []
    numbers = _parquet(tmp_path / "numbers.parquet", [{"question": 3, "answer": "3"}])  # no GSM8K question text
    found = _errors(load_config(grpo_yaml, [f"train_dataset.path={numbers}"]))
    assert len(found) == 1 and "rows have no column 'prompt' (columns: question, answer)" in found[0]


def test_only_the_schema_is_read_where_the_columns_decide(grpo_yaml: Path, prompts: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rows(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the rows were read")

    monkeypatch.setattr(pq, "ParquetFile", no_rows)
    assert _errors(load_config(grpo_yaml, [f"train_dataset.path={prompts}"])) == []


@pytest.fixture
def sft_mapping(tmp_path: Path, fake_model: Path) -> dict[str, Any]:
    (fake_model / "tokenizer.json").write_text("{}")
    (fake_model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    data = _parquet(tmp_path / "sft.parquet", [{"prompt": "Q: 1+2= A:", "response": " 3"}])
    return {"experiment_name": "sft-test", "trial_name": "t1", "type": "sft", "allocation_mode": "fsdp:d2",
            "actor": {"path": str(fake_model), "mb_spec": {"max_tokens_per_mb": 32}},
            "train_dataset": {"path": str(data), "type": "sft", "batch_size": 4, "max_length": 32}, **NO_IMAGES}


def test_sft_columns_of_a_parquet_dataset(sft_mapping: dict[str, Any], tmp_path: Path) -> None:
    assert _errors(config_from_mapping(sft_mapping, [])) == []
    found = _errors(config_from_mapping(sft_mapping, ["sft.response_key=answer"]))
    assert found == ["train_dataset.path: rows have no column 'answer' (sft.response_key; columns: prompt, response)"
                     "\n  fix: set sft.response_key to the right column"]
    chats = _parquet(tmp_path / "chats.parquet", [{"messages": [{"role": "user", "content": "hi"}]}])
    found = _errors(config_from_mapping(sft_mapping, ["sft.prompt_type=messages", f"train_dataset.path={chats}"]))
    assert len(found) == 1 and "the first row's chat has no assistant message" in found[0]


@pytest.fixture
def dpo_mapping(tmp_path: Path, fake_model: Path) -> dict[str, Any]:
    (fake_model / "tokenizer.json").write_text("{}")
    data = _parquet(tmp_path / "pairs.parquet", [{"prompt": "Q: 1+1= A:", "chosen": " 2", "rejected": " b"}])
    return {"experiment_name": "e", "trial_name": "t", "type": "dpo", "allocation_mode": "fsdp:d1",
            "actor": {"path": str(fake_model)}, "train_dataset": {"path": str(data), "batch_size": 4}, **NO_IMAGES}


def test_pair_columns_of_a_parquet_dataset(dpo_mapping: dict[str, Any], tmp_path: Path) -> None:
    assert _errors(config_from_mapping(dpo_mapping, [])) == []
    found = _errors(config_from_mapping(dpo_mapping, ["dpo.chosen_key=better"]))
    assert len(found) == 1 and found[0].startswith("train_dataset.path: rows have no column 'better' (columns: "
                                                   "prompt, chosen, rejected)")
    hh = _parquet(tmp_path / "hh.parquet", [{"chosen": "\n\nHuman: hi\n\nAssistant: hello",
                                            "rejected": "\n\nHuman: hi\n\nAssistant: go"}])
    assert _errors(config_from_mapping(dpo_mapping, [f"train_dataset.path={hh}"])) == [], "hh-rlhf's prompt is cut"


def test_without_pyarrow_a_parquet_dataset_is_accepted_and_left_to_the_job(
        grpo_yaml: Path, prompts: Path, dpo_mapping: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import pyarrow.parquet` raises ImportError
    assert dataset_head("train_dataset.path", prompts) is None
    assert _errors(load_config(grpo_yaml, [f"train_dataset.path={prompts}", "train_dataset.prompt_key=question"])) == []
    assert _errors(config_from_mapping(dpo_mapping, ["dpo.chosen_key=better"])) == []


def test_a_parquet_file_with_no_rows_is_judged_by_its_columns(tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    head = dataset_head("train_dataset.path", empty)
    assert head is not None and head.columns == ("prompt",) and head.first_row() is None


def test_a_verifiers_run_reads_the_task_column_of_parquet_rows(grpo_yaml: Path, tmp_path: Path) -> None:
    verifiers = ["rollout.agent.workflow=verifiers", "rollout.agent.verifiers.environment=my_taskset"]
    tasks = _parquet(tmp_path / "tasks.parquet", [{"prompt": "p", "task": i} for i in range(3)])
    assert _errors(load_config(grpo_yaml, [*verifiers, f"train_dataset.path={tasks}"])) == []
    no_tasks = _parquet(tmp_path / "no-tasks.parquet", [{"prompt": "p", "task": None}, {"prompt": "q", "task": 1}])
    found = _errors(load_config(grpo_yaml, [*verifiers, f"train_dataset.path={no_tasks}"]))
    assert len(found) == 1 and f"train_dataset.path {no_tasks}: rows 1 have no 'task'" in found[0]

"""Job type sft's config: the section loads from YAML, and validate_sft refuses bad configs naming field and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.config.ranges import check_ranges
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.sft import sft_row_limit
from rlkit.errors import ConfigErrors
from rlkit.jobs.sft.checks import validate_sft
from rlkit.jobs.validate import validate


@pytest.fixture
def sft_mapping(tmp_path: Path) -> dict[str, Any]:
    """A valid sft config (as read from YAML) whose model directory and datasets exist under tmp_path."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (model / "tokenizer.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    for name in ("train", "valid"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"prompt": "Q: 1+2= A:", "response": " 3"}) + "\n")
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    return {
        "experiment_name": "sft-test", "trial_name": "t1", "type": "sft", "allocation_mode": "fsdp:d2",
        "actor": {"path": str(model), "mb_spec": {"max_tokens_per_mb": 32}},
        "train_dataset": {"path": str(tmp_path / "train.jsonl"), "type": "sft", "batch_size": 4, "max_length": 32},
        "valid_dataset": {"path": str(tmp_path / "valid.jsonl"), "type": "sft", "max_length": 32},
    }


def problems_of(data: dict[str, Any], *overrides: str) -> list[str]:
    problems, config = Problems(), config_from_mapping(data, list(overrides))
    check_ranges(config, problems)  # what rlkit.checks.experiment runs before every job type's checks
    validate_sft(config, problems)
    return [str(e) for e in problems.errors]


def test_a_valid_config_has_no_problem(sft_mapping: dict[str, Any], tmp_path: Path) -> None:
    assert problems_of(sft_mapping) == []
    chats = str(tmp_path / "chats.jsonl")
    assert problems_of(sft_mapping, "sft.prompt_type=messages", f"train_dataset.path={chats}",
                       f"valid_dataset.path={chats}", "sft.enable_concatenated_multi_turn=true") == []


def test_a_tokenizer_without_chat_template_is_refused_when_rows_go_through_one(sft_mapping: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    (tmp_path / "model" / "tokenizer_config.json").write_text("{}")
    found = problems_of(sft_mapping)  # sft.apply_chat_template defaults to true
    assert len(found) == 1 and "has no chat template, but sft.apply_chat_template renders every row" in found[0]
    assert problems_of(sft_mapping, "sft.apply_chat_template=false") == []
    assert problems_of(sft_mapping, "sft.chat_template='{{ messages }}'") == [], "a template of the config's own"


def test_the_section_loads_with_its_defaults_and_names_unknown_keys(sft_mapping: dict[str, Any]) -> None:
    config = config_from_mapping(sft_mapping, ["sft.response_key=answer"])
    assert isinstance(config, ExperimentConfig)
    assert (config.sft.prompt_type, config.sft.prompt_key, config.sft.response_key) == ("plaintext", "prompt",
                                                                                        "answer")
    with pytest.raises(ConfigErrors, match=r"unknown key 'sft.response_column'"):
        config_from_mapping(sft_mapping, ["sft.response_column=answer", "sft.prompt_typ=messages"])


@pytest.mark.parametrize(("overrides", "expected"), [
    (["train_dataset.path="], ["train_dataset.path is not set"]),
    (["train_dataset.type=rl"], ["train_dataset.type is 'rl'", "fix: set train_dataset.type=sft"]),
    (["valid_dataset.path=/nonexistent/v.jsonl"], ["valid_dataset.path: '/nonexistent/v.jsonl' does not exist"]),
    (["sft.response_key=prompt"], ["sft.response_key and sft.prompt_key are both 'prompt'"]),
    (["sft.response_key=answer"], ["rows have no column 'answer' (sft.response_key"]),
    (["sft.prompt_type=chat"], ["sft.prompt_type 'chat' is not one of: plaintext, messages"]),
    (["sft.prompt_type=messages"], ["rows have no column 'messages'", "sft.prompt_type=plaintext"]),
    (["sft.prompt_type=messages", "sft.system_prompt=hi"], ["sft.system_prompt applies to plaintext rows"]),
    (["sft.enable_concatenated_multi_turn=true"], ["sft.enable_concatenated_multi_turn applies to chats"]),
    (["sft.apply_chat_template=false", "sft.chat_template='{{ x }}'"], ["sft.chat_template is set but"]),
    (["train_dataset.prompt_key=question"], ["train_dataset.prompt_key is 'question', but sft rows are read",
                                             "fix: set sft.prompt_key=question"]),
    (["valid_dataset.tools_key=functions"], ["valid_dataset.tools_key is 'functions', but sft rows are read with "
                                             "the sft section's keys", "fix: set sft.tools_key=functions"]),
    (["train_dataset.max_length=64"], ["train_dataset.max_length (64) exceeds actor.mb_spec.max_tokens_per_mb (32)"]),
    (["actor.mb_spec.max_tokens_per_mb=null", "train_dataset.max_length=100"],
     ["train_dataset.max_length (100) exceeds the model's context of 64 tokens"]),
    (["actor.mb_spec.max_tokens_per_mb=1"], ["actor.mb_spec.max_tokens_per_mb must be at least 2"]),
    (["actor.mb_spec.n_mbs=0"], ["actor.mb_spec.n_mbs must be at least 1"]),
    (["train_dataset.max_length=1"], ["train_dataset.max_length must be at least 2"]),
    (["actor.mb_spec.max_tokens_per_mb=null", "train_dataset.max_length=null", "sft.truncate=true"],
     ["sft.truncate needs train_dataset.max_length"]),
    (["train_dataset.batch_size=1"], ["train_dataset.batch_size (1) is smaller than the 2 trainer ranks"]),
    (["actor.path="], ["actor.path is not set"]),

    (["total_train_epochs=0"], ["total_train_epochs must be at least 1"]),
])
def test_bad_configs_are_refused_naming_the_field(sft_mapping: dict[str, Any], overrides: list[str],
                                                  expected: list[str]) -> None:
    found = "\n".join(problems_of(sft_mapping, *overrides))
    for text in expected:
        assert text in found


def test_max_length_left_out_is_the_micro_batch_budget_and_an_evaluator_may_say_each_epoch(
        sft_mapping: dict[str, Any]) -> None:
    """AReaL's sft configs set neither max_length nor anything but `evaluator.freq_epochs: 1`, which is what rlkit's
    sft does (validation at each epoch's end): both load; rows over the budget are dropped as over max_length."""
    assert problems_of(sft_mapping, "train_dataset.max_length=null", "valid_dataset.max_length=null") == []
    assert sft_row_limit(None, 32) == 32 and sft_row_limit(16, 32) == 16 and sft_row_limit(None, None) is None

    def validated(*overrides: str) -> str:
        return "\n".join(str(e) for e in validate(config_from_mapping(sft_mapping, list(overrides))).problems.errors)

    assert "evaluat" not in validated("evaluator.freq_epochs=1")
    assert ("job type sft evaluates valid_dataset at each epoch's end; other evaluator frequencies are not "
            "supported yet") in validated("evaluator.freq_steps=10")
    assert "evaluator.freq_epochs is 1, but valid_dataset.path is not set" in validated("evaluator.freq_epochs=1",
                                                                                        "valid_dataset.path=")


def test_every_problem_is_collected_at_once(sft_mapping: dict[str, Any]) -> None:
    found = problems_of(sft_mapping, "train_dataset.type=rl", "valid_dataset.type=generate",
                        "sft.response_key=prompt", "train_dataset.max_length=64", "train_dataset.batch_size=1",
                        "allocation_mode=fsdp:d2")
    assert len(found) == 5, found


def test_a_bad_first_row_is_named(sft_mapping: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert "the first row's chat has no assistant message" in "\n".join(
        problems_of(sft_mapping, "sft.prompt_type=messages", f"train_dataset.path={bad}", "valid_dataset.path="))
    bad.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "response": "x"}) + "\n")
    assert "column 'prompt' (sft.prompt_key) holds list, not text" in "\n".join(
        problems_of(sft_mapping, f"train_dataset.path={bad}"))


def test_the_first_row_s_tools_column_is_checked_at_submit(sft_mapping: dict[str, Any], tmp_path: Path) -> None:
    rows = tmp_path / "tools.jsonl"
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}  # no content
    chat = [{"role": "user", "content": "hi"}, call, {"role": "tool", "content": "1"},
            {"role": "assistant", "content": "one"}]
    messages = ("sft.prompt_type=messages", f"train_dataset.path={rows}", "valid_dataset.path=")
    rows.write_text(json.dumps({"messages": chat, "tools": json.dumps([{"name": "f"}])}) + "\n")
    assert problems_of(sft_mapping, *messages) == []
    rows.write_text(json.dumps({"messages": chat, "tools": "{not json"}) + "\n")
    assert problems_of(sft_mapping, *messages) == [
        "train_dataset.path: the first row's column 'tools' (sft.tools_key) is a string but not JSON (Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1)); write the tools as a list of function "
        "schemas, or a JSON string of one\n  fix: fix the rows' tools, or set sft.tools_key='' to read no tools column"]
    assert problems_of(sft_mapping, *messages, "sft.tools_key=") == []
    rows.write_text(json.dumps({"prompt": "hi", "response": "one", "tools": [{"name": "f"}]}) + "\n")
    assert "sft.apply_chat_template is false: raw text has no place for them" in "\n".join(
        problems_of(sft_mapping, f"train_dataset.path={rows}", "valid_dataset.path=", "sft.apply_chat_template=false"))


def test_the_checks_every_trainer_shares_run_for_sft(sft_mapping: dict[str, Any]) -> None:
    """sft gets grpo's optimizer, saver, recover and metrics checks (rlkit.checks.trainer, the ranges of
    rlkit.config.ranges), all at once."""
    found = problems_of(sft_mapping, "actor.optimizer.lr=0", "actor.optimizer.type=adamw", "saver.freq_steps=0",
                        "recover.keep_last=0", "stats_logger.wandb.mode=on")
    for says in ("actor.optimizer.lr must be positive", "actor.optimizer.type 'adamw' is not one of",
                 "saver.freq_steps must be at least 1", "recover.keep_last must be at least 1",
                 "stats_logger.wandb.mode"):
        assert sum(says in p for p in found) == 1, (says, found)


def test_a_problem_two_checks_find_is_reported_once() -> None:
    """The servers' and the trainer's checks both look at actor.path: one missing model is one problem."""
    from rlkit.errors import ConfigError

    problems = Problems()
    for _ in range(2):
        with problems.check():
            raise ConfigError("actor.path: '/m' is not a model directory", hint="point to a model")
    problems.add("actor.path: '/m' is not a model directory", hint="another fix")
    assert [e.hint for e in problems.errors] == ["point to a model", "another fix"]

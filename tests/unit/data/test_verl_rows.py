"""verl's dataset rows work as they are: a Parquet file shaped exactly as verl's examples/data_preprocess/gsm8k.py
writes it (`prompt` a list of chat messages, the reference answer nested in `reward_model.ground_truth`) passes the
submit-time checks with `reward.answer_key: reward_model.ground_truth`, its prompts are tokenized through the chat
template as verl's RLHFDataset does, and the built-in `math` reward reads the nested answer
(rlkit.data.row_field). A nested answer the first rows lack is refused at submit naming the row and where its path
breaks, hostile rows included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.load import load_config
from rlkit.data.row_field import MISSING, row_field, where_missing
from rlkit.jobs.validate import validate
from rlkit.rewards import resolve_reward_fn
from tests.conftest import run_rlkit
from tests.helpers.verl_rows import ANSWER, GSM8K, INSTRUCTION, verl_gsm8k_parquet, verl_gsm8k_row, write_parquet


@pytest.fixture
def verl_train(tmp_path: Path) -> Path:
    return verl_gsm8k_parquet(tmp_path / "train.parquet")


def _errors(config: Any) -> list[str]:
    return [str(e) for e in validate(config).problems.errors]


@pytest.mark.parametrize(("row", "key", "value"), [
    ({"reward_model": {"ground_truth": "72"}}, ANSWER, "72"),
    ({"answer": "5"}, "answer", "5"),
    ({"a": {"b": {"c": 0}}}, "a.b.c", 0),
    ({ANSWER: "top", "reward_model": {"ground_truth": "nested"}}, ANSWER, "top"),  # a column of that exact name wins
    ({"reward_model": {"ground_truth": None}}, ANSWER, None),
    ({"reward_model": "72"}, ANSWER, MISSING),  # a string on the path: missing, not a TypeError
    ({"reward_model": ["ground_truth"]}, ANSWER, MISSING),
    ({"reward_model": None}, ANSWER, MISSING),
    ({"reward_model": {"style": "rule"}}, ANSWER, MISSING),
    ({"reward_model": {"ground_truth": "72"}}, "reward_model..ground_truth", MISSING),
    ({"reward_model": {"ground_truth": "72"}}, "reward_model.ground_truth.", MISSING),
    ("not a row", ANSWER, MISSING),
    ([{"reward_model": {}}], ANSWER, MISSING),
])
def test_row_field_reads_a_column_or_a_nested_path_and_hostile_rows_as_missing(row: Any, key: str,
                                                                               value: Any) -> None:
    assert row_field(row, key) == value if value is not MISSING else row_field(row, key) is MISSING


def test_where_a_path_breaks_is_said() -> None:
    assert where_missing({"reward_model": "72"}, ANSWER) == "reward_model is a str, not an object"
    assert where_missing({"reward_model": None}, ANSWER) == "reward_model is null, not an object"
    assert where_missing({"reward_model": {}}, ANSWER) == "reward_model has no 'ground_truth'"
    assert where_missing({"question": "q"}, ANSWER) == "the row has no 'reward_model'"
    assert where_missing({"reward_model": {"ground_truth": None}}, ANSWER) == f"{ANSWER} is null"
    assert where_missing({"answer": None}, "answer") == "its column answer is null"


def test_a_verl_parquet_passes_submit_and_renders(grpo_yaml: Path, verl_train: Path, tmp_path: Path) -> None:
    """`rlkit render` of a config pointing at verl's train and test files; without the nested answer key the
    default column 'answer' is refused naming the struct columns the file has."""
    test = write_parquet(tmp_path / "test.parquet", [verl_gsm8k_row(0, *GSM8K[2], split="test")])
    data = [f"train_dataset.path={verl_train}", f"valid_dataset.path={test}", "evaluator.freq_steps=1"]
    rendered = run_rlkit("render", str(grpo_yaml), *data, f"reward.answer_key={ANSWER}")
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr
    refused = _errors(load_config(grpo_yaml, data))
    assert len(refused) == 2 and "'answer', which the valid_dataset rows do not have" in refused[1]
    assert refused[0].startswith(
        "reward.fn math needs the answer column 'answer', which the dataset rows do not have (columns: "
        "data_source, prompt, ability, reward_model, extra_info)"), refused
    assert "e.g. reward_model.ground_truth" in refused[0]


def test_a_nested_answer_the_first_rows_lack_is_refused_naming_the_row(grpo_yaml: Path, tmp_path: Path) -> None:
    rows = [verl_gsm8k_row(i, q, a) for i, (q, a) in enumerate(GSM8K)]
    hostile = write_parquet(tmp_path / "hostile.parquet", [rows[0], {**rows[1], "reward_model": None}, rows[2]])
    text = tmp_path / "text.jsonl"  # JSON Lines: reward_model a string in the second row
    text.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "reward_model": "10"}) + "\n")
    for path, field, where in ((hostile, "train_dataset", "row 2 of the dataset rows lacks (reward_model is null, "
                                                          "not an object)"),
                               (text, "train_dataset", "row 2 of the dataset rows lacks (reward_model is a str, "
                                                       "not an object)"),
                               (hostile, "valid_dataset", "row 2 of the valid_dataset rows lacks (reward_model is "
                                                          "null")):
        overrides = [f"{field}.path={path}", f"reward.answer_key={ANSWER}"]
        if field == "valid_dataset":
            train = write_parquet(tmp_path / "ok.parquet", rows)
            overrides += [f"train_dataset.path={train}", "evaluator.freq_steps=1"]
        found = _errors(load_config(grpo_yaml, overrides))
        assert len(found) == 1 and f"the answer field '{ANSWER}', which {where}" in found[0], found
    found = _errors(load_config(grpo_yaml, [f"train_dataset.path={hostile}", "reward.answer_key=reward_model.truth"]))
    assert len(found) == 1 and "row 1 of the dataset rows lacks (reward_model has no 'truth')" in found[0], found
    found = _errors(load_config(grpo_yaml, [f"train_dataset.path={hostile}", "reward.answer_key=extra.answer"]))
    assert len(found) == 1 and "the answer column 'extra.answer', which the dataset rows do not have" in found[0]


def test_generate_scores_verl_rows_by_the_nested_answer(generate_yaml: Path, verl_train: Path, tmp_path: Path) -> None:
    base = [f"generate.dataset.path={verl_train}", "generate.score=true"]
    assert _errors(load_config(generate_yaml, [*base, f"reward.answer_key={ANSWER}"])) == []
    broken = write_parquet(tmp_path / "b.parquet", [{**verl_gsm8k_row(0, *GSM8K[0]), "reward_model": {"style": "x"}}])
    found = _errors(load_config(generate_yaml, [f"generate.dataset.path={broken}", "generate.score=true",
                                                f"reward.answer_key={ANSWER}"]))
    assert len(found) == 1 and "row 1 of the generate.dataset.path rows lacks (reward_model has no " \
                               "'ground_truth')" in found[0], found


def test_the_job_reads_verl_rows_prompts_by_the_chat_template_and_scores_the_nested_answer(
        grpo_yaml: Path, verl_train: Path, tiny_model_dir: Path) -> None:
    """The grpo job's own prompt loading (rlkit.jobs.grpo.algorithm.load_prompts, rows through `datasets` as in the
    job): each prompt's tokens are verl's (its agent loop's apply_chat_template(messages, add_generation_prompt=True,
    tokenize=True); its older RLHFDataset's template text tokenized without special tokens, the same here); `math`,
    bound as the reward worker binds it, scores a right and a wrong completion 1.0 and 0.0."""
    from transformers import AutoTokenizer

    from rlkit.jobs.grpo.algorithm import load_prompts

    config = load_config(grpo_yaml, [f"train_dataset.path={verl_train}", f"reward.answer_key={ANSWER}"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = load_prompts(config, tokenizer)
    assert len(prompts) == len(GSM8K)
    for prompt, (question, _) in zip(prompts, GSM8K, strict=True):
        messages = [{"role": "user", "content": question + " " + INSTRUCTION}]
        verl_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert question in verl_text and verl_text != messages[0]["content"]  # the template wrapped it
        verl_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
        assert prompt.ids == list(verl_ids) == tokenizer(verl_text, add_special_tokens=False)["input_ids"]
        assert prompt.row["prompt"] == messages and prompt.row["data_source"] == "openai/gsm8k"
    math = resolve_reward_fn("math", config.reward.answer_key)
    row = prompts[0].row
    assert row["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert math(prompts[0].text, "48/2 = 24 in May, 48 + 24 = 72.\n#### 72", row) == 1.0
    assert math(prompts[0].text, "48 + 48/2 = 71.\n#### 71", row) == 0.0
    with pytest.raises(KeyError, match=r"no answer at 'reward_model.ground_truth' .*reward_model has no "
                                       r"'ground_truth'"):
        math(prompts[0].text, "#### 72", {**row, "reward_model": {"style": "rule"}})


def test_an_answer_key_naming_an_object_fails_each_reward_call() -> None:
    """reward.answer_key reward_model (verl's struct column, ground_truth left out) is a column the rows have (submit
    reads only the schema there), but its value is an object, never an answer: each call fails naming the keys
    inside it (counted: the trainer stops after its failing steps, generate.score exits 78), not a silent 0.0 that
    reads as the model's."""
    row = {"reward_model": {"ground_truth": "72", "style": "rule"}}
    for fn in ("math", "exact_match"):
        with pytest.raises(KeyError, match="is an object \\(its keys: ground_truth, style\\)"):
            resolve_reward_fn(fn, "reward_model")("q", "The answer is \\boxed{72}", row)
    assert resolve_reward_fn("math", ANSWER)("q", "The answer is \\boxed{72}", row) == 1.0


def test_a_list_of_accepted_answers_credits_any_of_them(tmp_path: Path) -> None:
    """QA sets store every accepted form of the answer as a list (Search-R1's verl rows:
    `reward_model.ground_truth.target`); read from Parquet as the job reads it (rlkit.data.files.load_rows), a
    completion matching any element scores 1.0 (a text's stringified list matched none but a one-element list's)."""
    from rlkit.data.files import load_rows

    rows = load_rows(write_parquet(tmp_path / "qa.parquet", [
        {"question": "Capital of France?", "reward_model": {"ground_truth": {"target": ["Paris", "paris, france"]}}},
        {"question": "2+2?", "reward_model": {"ground_truth": {"target": ["4", "four"]}}}]))
    key = "reward_model.ground_truth.target"
    exact, math = resolve_reward_fn("exact_match", key), resolve_reward_fn("math", key)
    assert [exact("q", said, rows[0]) for said in ("Paris", "\\boxed{paris, france}", "Lyon")] == [1.0, 1.0, 0.0]
    assert [math("q", said, rows[1]) for said in ("so \\boxed{4}", "it is 4.0", "5")] == [1.0, 1.0, 0.0]
    plain = resolve_reward_fn("math", "answer")  # numbers as JSON writes them, alone or listed
    assert plain("q", "\\boxed{4}", {"answer": [7, 4]}) == 1.0 and plain("q", "\\boxed{4}", {"answer": 4}) == 1.0
    assert exact("q", "four", rows[1]) == 1.0


@pytest.mark.parametrize(("gold", "says"), [([], "is an empty list"), ([None], "a list holding null"),
                                            ([{"a": 1}], "a list holding a dict"), ([["4"]], "a list holding a list")])
def test_a_list_answer_that_holds_no_answer_fails_each_call(gold: Any, says: str) -> None:
    for fn in ("math", "exact_match"):
        with pytest.raises(KeyError, match=says):
            resolve_reward_fn(fn, "answer")("q", "\\boxed{4}", {"answer": gold})

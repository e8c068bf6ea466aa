"""Single-turn tool-calling RL prompts (a prompt dataset's tools_key), with the tiny model's real tokenizer and
Qwen2.5's tool-use template: the row's tools reach the prompt the servers complete, a JSON-string column is the list
column, a malformed one or one the prompt cannot carry is refused naming the row (at submit for the first row), and
rows without tools tokenize exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.checks.prompt_tools import check_prompt_tools
from rlkit.config.schema.experiment import DatasetConfig, ExperimentConfig
from rlkit.data.dataset_head import dataset_head
from rlkit.data.files import prompt_token_ids
from rlkit.errors import ConfigError, StepError
from rlkit.jobs.grpo.algorithm import load_prompts
from rlkit.jobs.prompt_rows import row_prompt_ids
from tests.unit.jobs.test_sft_tools import QWEN25_TEMPLATE, WEATHER, malformed_tools

CHAT = [{"role": "user", "content": "Weather in Paris?"}]
DS = DatasetConfig(path="d.jsonl")


@pytest.fixture(scope="module")
def qwen(tiny_model_dir: Path) -> Any:
    """The tiny tokenizer with Qwen2.5's tool-use template as its chat template (its own copy: `tok` keeps the
    tiny template, which ignores tools)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


def ids(row: dict[str, Any], tokenizer: Any, *, ds: DatasetConfig = DS, index: int = 0, chat_template: bool = False,
        field: str = "train_dataset") -> list[int]:
    return row_prompt_ids(row, index, row[ds.prompt_key], tokenizer, ds, field=field, chat_template=chat_template)


def test_the_schema_reaches_the_prompt_tokens(qwen: Any) -> None:
    got = ids({"prompt": CHAT, "tools": [WEATHER]}, qwen)
    text = qwen.decode(got)
    assert json.dumps(WEATHER) in text and "<tools>" in text and text.endswith("<|im_start|>assistant\n")
    assert got == list(qwen.apply_chat_template(CHAT, tools=[WEATHER], add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    # a string prompt wrapped in the template (generate.apply_chat_template) carries them the same way
    assert ids({"prompt": "Weather in Paris?", "tools": [WEATHER]}, qwen, chat_template=True) == got


def test_a_json_string_column_is_the_list_column(qwen: Any) -> None:
    listed = ids({"prompt": CHAT, "tools": [WEATHER]}, qwen)
    assert json.dumps(WEATHER) in qwen.decode(listed)
    assert ids({"prompt": CHAT, "tools": json.dumps([WEATHER])}, qwen) == listed
    renamed = DatasetConfig(path="d.jsonl", tools_key="functions")
    assert ids({"prompt": CHAT, "functions": json.dumps([WEATHER])}, qwen, ds=renamed) == listed


def test_without_tools_the_tokens_are_today_s(qwen: Any, tok: Any) -> None:
    """No column, null, "" or [], or tools_key '': the call the prompts always went through, token for token."""
    for tokenizer in (qwen, tok):
        before = list(tokenizer.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False))
        assert prompt_token_ids(CHAT, tokenizer, chat_template=False) == before
        for row in ({"prompt": CHAT}, *({"prompt": CHAT, "tools": empty} for empty in (None, "", []))):
            assert ids(row, tokenizer) == before
        assert ids({"prompt": CHAT, "tools": [WEATHER]}, tokenizer, ds=DatasetConfig(path="d", tools_key="")) == before
        assert ids({"prompt": "1+1=", "tools": None}, tokenizer) == tokenizer.encode("1+1=", add_special_tokens=False)
    assert "<tools>" not in qwen.decode(ids({"prompt": CHAT}, qwen))


@pytest.mark.parametrize(("tools", "message"), malformed_tools("train_dataset.tools_key"))
def test_a_malformed_tools_column_fails_naming_the_row(qwen: Any, tools: Any, message: str) -> None:
    with pytest.raises(StepError, match=rf"^dataset d\.jsonl: row 3: {message}"):
        ids({"prompt": CHAT, "tools": tools}, qwen, index=3)


def test_tools_the_prompt_cannot_carry_are_refused(qwen: Any, tok: Any) -> None:
    with pytest.raises(StepError, match=r"row 0: the row has tools \(train_dataset.tools_key\) but its prompt is a "
                                        r"string sent as raw text.*chat messages, or set train_dataset.tools_key=''"):
        ids({"prompt": "Weather in Paris?", "tools": [WEATHER]}, qwen)
    with pytest.raises(StepError, match=r"its prompt is token ids, rendered already"):
        ids({"prompt": [1, 2, 3], "tools": [WEATHER]}, qwen)
    with pytest.raises(StepError, match=r"row 0: the row has tools \(generate.dataset.tools_key\) but the chat "
                                        r"template renders the prompt the same without them"):
        ids({"prompt": CHAT, "tools": [WEATHER]}, tok, field="generate.dataset")  # the tiny template ignores tools
    failing = "{% if tools %}{{ raise_exception('this template takes no tools') }}{% endif %}" + tok.chat_template
    with pytest.raises(StepError, match=r"failed on this prompt and its tools.*this template takes no tools"):
        row_prompt_ids({"tools": [WEATHER]}, 0, CHAT, _Templated(tok, failing), DS, field="d", chat_template=False)


class _Templated:
    """`tokenizer` rendering with `template` (a tokenizer's own template is what the RL prompts use)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tokenizer, self.template = tokenizer, template

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, chat_template=self.template, **kwargs)


def test_grpo_s_prompts_carry_each_row_s_tools_and_the_reward_sees_them(qwen: Any, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [{"prompt": CHAT, "tools": json.dumps([WEATHER]), "answer": "get_weather"},
            {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ExperimentConfig()
    config.train_dataset.path = str(data)
    prompts = load_prompts(config, qwen)
    assert [p.index for p in prompts] == [0, 1]
    assert json.dumps(WEATHER) in prompts[0].text and "<tools>" not in prompts[1].text
    assert prompts[0].ids == list(qwen.apply_chat_template(CHAT, tools=[WEATHER], add_generation_prompt=True,
                                                           tokenize=True, return_dict=False))
    assert prompts[0].row["tools"] == json.dumps([WEATHER])  # the row the reward function is called with
    data.write_text(data.read_text() + json.dumps({"prompt": CHAT, "tools": {"name": "x"}}) + "\n")
    with pytest.raises(StepError, match=rf"dataset {data}: row 2: column 'tools' \(train_dataset.tools_key\) "
                                        "holds dict"):
        load_prompts(config, qwen)


@pytest.mark.parametrize(("row", "chat_template", "says"), [
    ({"prompt": CHAT, "tools": "[{"}, False, r"train_dataset.path: the first row's column 'tools' "
                                                r"\(train_dataset.tools_key\) is a string but not JSON"),
    ({"prompt": "Q?", "tools": [WEATHER]}, False, r"train_dataset.path: the first row: the row has tools "
                                                  r"\(train_dataset.tools_key\) but its prompt is a string sent"),
    ({"prompt": CHAT, "tools": [WEATHER]}, False, None),
    ({"prompt": "Q?", "tools": [WEATHER]}, True, None),
    ({"prompt": "Q?", "tools": ""}, False, None),
    ({"question": "Q?", "answer": "#### 1", "tools": [WEATHER]}, False, None),  # GSM8K's: a chat prompt
])
def test_the_first_row_is_judged_at_submit(tmp_path: Path, row: dict[str, Any], chat_template: bool,
                                           says: str | None) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    head = dataset_head("train_dataset.path", data)
    assert head is not None
    if says is None:
        check_prompt_tools("train_dataset", DatasetConfig(path=str(data)), head, chat_template=chat_template)
        return
    with pytest.raises(ConfigError, match=says):
        check_prompt_tools("train_dataset", DatasetConfig(path=str(data)), head, chat_template=chat_template)


def test_episodes_refuse_a_row_s_tools_rather_than_drop_them(qwen: Any, tmp_path: Path) -> None:
    """rollout.agent's episodes offer the workflow's tools (rollout.agent.tools): a row's tools would be dropped."""
    says = r"row 0: the row has tools \(train_dataset.tools_key\) but rollout.agent.workflow runs episodes"
    with pytest.raises(StepError, match=says):
        row_prompt_ids({"prompt": CHAT, "tools": [WEATHER]}, 0, CHAT, qwen, DS, field="train_dataset",
                       chat_template=False, episodes=True)
    assert row_prompt_ids({"prompt": CHAT}, 0, CHAT, qwen, DS, field="train_dataset", chat_template=False,
                          episodes=True) == ids({"prompt": CHAT}, qwen)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "Q?", "tools": [WEATHER]}) + "\n")
    head = dataset_head("train_dataset.path", data)
    assert head is not None
    with pytest.raises(ConfigError, match="train_dataset.path: the first row: the row has tools "
                                          r"\(train_dataset.tools_key\) but rollout.agent.workflow runs episodes"):
        check_prompt_tools("train_dataset", DatasetConfig(path=str(data)), head, chat_template=False, episodes=True)


def test_submit_refuses_a_grpo_run_whose_first_row_cannot_carry_its_tools(tmp_path: Path) -> None:
    """Through the job type's own checks, as `rlkit submit` runs them."""
    from rlkit.config.load import load_config
    from tests.conftest import CONFIGS, raise_problems

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "Q?", "tools": [WEATHER], "answer": "1"}) + "\n")
    config = load_config(CONFIGS / "grpo-cpu-demo.yaml", [f"train_dataset.path={data}", f"valid_dataset.path={data}"])
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    for field in ("train_dataset", "valid_dataset"):
        assert (f"{field}.path: the first row: the row has tools ({field}.tools_key) but its prompt is a string sent "
                "as raw text") in str(info.value)


def test_submit_refuses_generate_s_raw_text_prompts_with_tools_unless_they_are_wrapped(tmp_path: Path) -> None:
    from rlkit.config.load import load_config
    from tests.conftest import CONFIGS, raise_problems

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "Q?", "tools": json.dumps([WEATHER])}) + "\n")
    config = load_config(CONFIGS / "generate-cpu-demo.yaml", [f"generate.dataset.path={data}"])
    with pytest.raises(ConfigError, match=r"generate.dataset.path: the first row: the row has tools "
                                          r"\(generate.dataset.tools_key\) but its prompt is a string sent as raw "
                                          r"text, which has no place for them; give the prompt as chat messages "
                                          r"\(or set generate.apply_chat_template=true\)"):
        raise_problems(config)
    wrapped = load_config(CONFIGS / "generate-cpu-demo.yaml", [f"generate.dataset.path={data}",
                                                                "generate.apply_chat_template=true"])
    try:
        raise_problems(wrapped)
    except ConfigError as exc:
        assert "tools_key" not in str(exc)

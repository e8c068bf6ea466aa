"""SFT on tool-calling chats (sft.tools_key), with the tiny model's real tokenizer and Qwen2.5's tool-use template:
the row's tools reach every render of the chat, the loss covers the assistant turns (tool calls included) and never
the tool results, and a tools column or template that cannot carry the tools is refused naming the row."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from rlkit.config.schema.sft import SFTConfig
from rlkit.errors import StepError
from rlkit.jobs.sft.data import row_example, tokenize_rows
from tests.unit.jobs.test_sft_data import spans

# Qwen2.5-Instruct's chat template (its tool parts as released; its default system message shortened)
QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are helpful.' }}"
    "{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "18C, sunny", "name": "get_weather"},
    {"role": "assistant", "content": "It is 18C and sunny in Paris."},
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
TOOLS_SFT = SFTConfig(prompt_type="messages", chat_template=QWEN25_TEMPLATE, enable_concatenated_multi_turn=True)


def test_the_tools_reach_the_prompt_and_the_loss_is_on_the_assistant_turns_only(tok: Any) -> None:
    ex = row_example({"messages": CHAT, "tools": [WEATHER]}, tok, TOOLS_SFT)
    text = tok.decode(ex.input_ids)
    assert text == tok.apply_chat_template(CHAT, tools=[WEATHER], tokenize=False, chat_template=QWEN25_TEMPLATE)
    prompt = tok.decode(ex.input_ids[: ex.loss_mask.index(1)])
    assert json.dumps(WEATHER) in prompt and "<tools>" in prompt  # the schema, as the template writes it
    assert spans(tok, ex) == [CALL, "It is 18C and sunny in Paris.<|im_end|>"]  # not the tool's result
    last_only = row_example({"messages": CHAT, "tools": [WEATHER]}, tok,
                            SFTConfig(prompt_type="messages", chat_template=QWEN25_TEMPLATE))
    assert last_only.input_ids == ex.input_ids and spans(tok, last_only) == [
        "It is 18C and sunny in Paris.<|im_end|>"]


def test_a_json_string_column_is_the_list_column(tok: Any) -> None:
    listed = row_example({"messages": CHAT, "tools": [WEATHER]}, tok, TOOLS_SFT)
    assert row_example({"messages": CHAT, "tools": json.dumps([WEATHER])}, tok, TOOLS_SFT) == listed
    renamed = SFTConfig(prompt_type="messages", chat_template=QWEN25_TEMPLATE, enable_concatenated_multi_turn=True,
                        tools_key="functions")
    assert row_example({"messages": CHAT, "functions": json.dumps([WEATHER])}, tok, renamed) == listed
    none = row_example({"messages": CHAT}, tok, TOOLS_SFT)
    assert all(row_example({"messages": CHAT, "tools": empty}, tok, TOOLS_SFT) == none for empty in (None, "", []))
    assert "<tools>" not in tok.decode(none.input_ids)


def test_a_parquet_column_s_null_filled_fields_are_not_written_into_the_prompt(tok: Any) -> None:
    """Arrow gives every struct of a column one schema: a row whose tool lacks a field another row's has comes back
    with it null ("enum": null), which the template would write into the prompt as the schema's."""
    import pyarrow as pa

    unit = {"type": "function", "function": {
        "name": "convert", "description": "Convert a temperature.",
        "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["unit"]}}}
    read = pa.Table.from_pylist([{"tools": [WEATHER]}, {"tools": [unit]}]).to_pylist()
    assert "None" in str(read[0]["tools"])  # what Arrow hands back: the weather tool with unit's fields, null
    ex = row_example({"messages": CHAT, "tools": read[0]["tools"]}, tok, TOOLS_SFT)
    assert ex == row_example({"messages": CHAT, "tools": [WEATHER]}, tok, TOOLS_SFT)
    assert "null" not in tok.decode(ex.input_ids)


def malformed_tools(setting: str) -> list[tuple[Any, str]]:
    """Bad tools column values and what each is refused with, the column named by `setting` (sft's, or an RL
    prompt dataset's: rlkit.data.chat_tools.row_tools serves both)."""
    where = rf"column 'tools' \({re.escape(setting)}\)"
    return [('[{"type": "function", ', rf"{where} is a string but not JSON"),
            ("[" * 100_000, rf"{where} is a string but not JSON"),
            ({"type": "function"}, rf"{where} holds dict, not a list of function schemas"),
            ('["get_weather"]', rf"{where}: tool 0 is str, not a function schema")]


@pytest.mark.parametrize(("tools", "message"), malformed_tools("sft.tools_key"))
def test_a_malformed_tools_column_fails_naming_the_row(tok: Any, tools: Any, message: str) -> None:
    rows = [{"messages": CHAT, "tools": [WEATHER]}, {"messages": CHAT, "tools": tools}]
    with pytest.raises(StepError, match=rf"train\.jsonl: row 1: {message}"):
        tokenize_rows(rows, tok, TOOLS_SFT, max_length=None, source="train.jsonl")


@pytest.mark.parametrize(("call", "message"), [
    ({"tool_calls": "get_weather()"}, "message 1's tool_calls is not a list"),
    ({"tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}], "role": "user"}, "message 1 is not"),
    ({"tool_calls": [{"function": None}]}, "the chat template failed on this chat and its tools: "),
])
def test_a_malformed_tool_call_fails_naming_the_row(tok: Any, call: dict[str, Any], message: str) -> None:
    chat = [CHAT[0], {**CHAT[1], **call}, *CHAT[2:]]
    with pytest.raises(StepError, match=rf"t\.jsonl: row 0: {message}"):
        tokenize_rows([{"messages": chat, "tools": [WEATHER]}], tok, TOOLS_SFT, max_length=None, source="t.jsonl")


def test_a_template_without_tools_is_refused_rather_than_trained_on_prompts_missing_them(tok: Any) -> None:
    ignoring = SFTConfig(prompt_type="messages")  # the tiny model's own template never reads tools
    row = {"messages": [CHAT[0], CHAT[3]], "tools": [WEATHER]}
    with pytest.raises(StepError, match=r"d: row 0: the row has tools \(sft.tools_key\) but the chat template "
                                        r"renders the chat the same without them.*sft.tools_key=''"):
        tokenize_rows([row], tok, ignoring, max_length=None, source="d")
    failing = SFTConfig(prompt_type="messages", chat_template=(
        "{% if tools %}{{ raise_exception('this template takes no tools') }}{% endif %}" + tok.chat_template))
    with pytest.raises(StepError, match=r"failed on this chat and its tools: .*this template takes no tools"):
        tokenize_rows([row], tok, failing, max_length=None, source="d")
    plain = row_example({"messages": row["messages"]}, tok, ignoring)
    assert row_example(row, tok, SFTConfig(prompt_type="messages", tools_key="")) == plain  # told to read none


def test_plaintext_rows_take_tools_through_the_template_only(tok: Any) -> None:
    sft = SFTConfig(chat_template=QWEN25_TEMPLATE)
    ex = row_example({"prompt": "Weather in Paris?", "response": "Sunny.", "tools": json.dumps([WEATHER])}, tok, sft)
    assert json.dumps(WEATHER) in tok.decode(ex.input_ids) and spans(tok, ex) == ["Sunny.<|im_end|>"]
    with pytest.raises(ValueError, match=r"sft\.apply_chat_template is false: raw text has no place for them"):
        row_example({"prompt": "Q", "response": "A", "tools": [WEATHER]}, tok, SFTConfig(apply_chat_template=False))

"""A row's tools column (`sft.tools_key`; an RL prompt dataset's `tools_key`): the function schemas its chat
template is given as `tools=`, and whether a template reads them at all.

Published tool-calling datasets store the schemas two ways: as a list of JSON objects, or as a JSON string of that
list (Arrow gives every struct in a column one schema, so a list of differing schemas comes back with the missing
fields set to null; a string keeps each schema as written, and TRL's and Trinity-RFT's readers accept both). Rows
are input others wrote: a value that is neither is a ValueError naming the column (callers name the row), never a
schema passed on for the template to fail on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlkit import untrusted_json


def row_tools(row: Mapping[str, Any], key: str, setting: str = "sft.tools_key") -> list[dict[str, Any]] | None:
    """The tools of `row`: None when `key` is empty or the row has no tools there (no column, null, "", an empty
    list); else the list of schemas. ValueError for a value that is not a list of JSON objects or a JSON string of
    one, naming the column and `setting` (the config key that named it)."""
    if not key or key not in row:
        return None
    value = row[key]
    where = f"column '{key}' ({setting})"
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = untrusted_json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{where} is a string but not JSON ({exc}); write the tools as a list of function "
                             "schemas, or a JSON string of one") from None
    elif isinstance(value, list):
        value = _without_nulls(value)  # Arrow's null-filled fields (the module's docstring)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{where} holds {type(value).__name__}, not a list of function schemas")
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping):
            raise ValueError(f"{where}: tool {i} is {type(tool).__name__}, not a function schema (a JSON object)")
    return [dict(tool) for tool in value] or None


def _without_nulls(value: Any) -> Any:
    """`value` with every null-valued key of its objects dropped, at any depth: a list-form column read through
    Arrow carries each schema's missing fields as nulls ("enum": null), which a template would write into the prompt
    as if the schema said them. A JSON string column keeps its schemas as written."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def ignores_tools(with_tools: object, render_without: Callable[[], object]) -> bool:
    """Whether a chat template wrote `with_tools` (its render of a chat given the row's tools, text or token ids)
    the same without them: Hugging Face's apply_chat_template passes `tools` to any template, and one that never
    reads them drops them silently, so the model would be trained or sampled on calling tools it was never shown.
    `render_without` renders the same chat without tools; a template that fails without tools reads them."""
    try:
        return render_without() == with_tools
    except Exception:  # Jinja's errors (raise_exception too), or the caller's ValueError for them
        return False


def episode_tools_refusal(setting: str) -> str:
    """Why a row's tools are refused with rollout.agent: an episode offers the workflow's tools, never a row's."""
    return (f"the row has tools ({setting}) but rollout.agent.workflow runs episodes, which offer the model the "
            f"workflow's tools (rollout.agent.tools), not a row's; set {setting}='' to read no tools column (a "
            "workflow function still gets the row, its tools column included)")

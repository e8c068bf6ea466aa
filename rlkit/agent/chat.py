"""The chat template's side of an episode: offering the tools in the prompt, and the text rlkit inserts between turns.

`tokenizer` is any Hugging Face tokenizer (only `encode`, `apply_chat_template`, `all_special_tokens` and
`get_added_vocab` are used; no torch). Two template facts shape this module:

- Templates that know tools (Qwen2.5's) take `tools=[...]` in `apply_chat_template` and describe them in their own
  words; others (rlkit's tiny model) silently ignore the argument. `template_takes_tools` finds out by rendering
  with and without a probe tool; a template that ignores tools gets a short description in the system message
  instead (`tools_system_text`), so the model is offered its tools either way.
- Between two sampled assistant turns rlkit inserts the template's glue: the end of the assistant turn, the tool
  results (or a user turn) as the template writes them, and the start of the next assistant turn. `turn_glue`
  renders exactly that text from the template itself, so it follows any template (Qwen2.5 writes tool results as a
  user turn of `<tool_response>` blocks; the tiny template as a `tool` turn), and the caller tokenizes it once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.agent.tool_calls import tools_system_text
from rlkit.data.row_formats import rl_prompt

_MARKER = "\u2063rlkit-turn-end\u2063"  # assistant content that no template rewrites and no model writes
_PROBE_TOOL = {"name": "rlkit_probe", "description": "probe", "parameters": {"type": "object", "properties": {}}}


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"the chat template rendered {type(text).__name__}, not text")
    return text


def as_template_tools(schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas in the form templates take (`{"type": "function", "function": schema}`)."""
    return [{"type": "function", "function": dict(schema)} for schema in schemas]


def template_takes_tools(tokenizer: Any) -> bool:
    """True if the chat template renders `tools=`; False if it ignores them or fails with them."""
    probe = [{"role": "user", "content": "hi"}]
    try:
        plain = _render(tokenizer, probe, add_generation_prompt=True)
        with_tools = _render(tokenizer, probe, add_generation_prompt=True, tools=as_template_tools([_PROBE_TOOL]))
    except Exception:  # a template that fails with tools does not take them
        return False
    return with_tools != plain


def messages_with_tool_text(messages: Sequence[Mapping[str, Any]],
                            schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with the tools described in the system message (appended to it, or a new one in front)."""
    out = [dict(m) for m in messages]
    text = tools_system_text(schemas)
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content', '')}\n\n{text}".lstrip("\n")
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def episode_chat(row: Mapping[str, Any], prompt_key: str, fallback: str | None = None) -> list[dict[str, Any]] | None:
    """The chat an episode starts from: the row's messages, or its prompt text as a user turn (GSM8K's question as
    AReaL asks it); `fallback` (as a user turn) where the row has no prompt column, else None."""
    try:
        messages = rl_prompt(row, prompt_key)
    except KeyError:
        if fallback is None:
            return None
        messages = fallback
    return messages if isinstance(messages, list) else [{"role": "user", "content": str(messages)}]


def render_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                  schemas: Sequence[Mapping[str, Any]] = (), *, takes_tools: bool | None = None) -> str:
    """The first prompt's text, tools offered through the template when it takes them, else in the system message;
    ends with the start of the assistant's turn. `takes_tools`: `template_takes_tools(tokenizer)` when the caller
    already knows it (it renders the template twice)."""
    if takes_tools is None and schemas:
        takes_tools = template_takes_tools(tokenizer)
    if schemas and takes_tools:
        return _render(tokenizer, [dict(m) for m in messages], add_generation_prompt=True,
                       tools=as_template_tools(schemas))
    if schemas:
        return _render(tokenizer, messages_with_tool_text(messages, schemas), add_generation_prompt=True)
    return _render(tokenizer, [dict(m) for m in messages], add_generation_prompt=True)


def control_tokens(tokenizer: Any) -> list[str]:
    """Every token text that `encode` turns into one added token: the special tokens and the rest of the added
    vocabulary (Llama 3's header ids, Qwen2.5's <tool_call> and <tool_response> are added but not "special")."""
    added = getattr(tokenizer, "get_added_vocab", None)
    words = set(getattr(tokenizer, "all_special_tokens", []))
    if callable(added):
        words.update(str(word) for word in added())
    return sorted(words)


def neutralize_special_tokens(text: str, special_tokens: Sequence[str]) -> str:
    """`text` with every special token's spelling broken by a space (`<|im_start|>` -> `< |im_start|>`).

    Tool output and environment text are written by others: left as they are, a tool printing `<|im_end|>` would be
    tokenized as the real control token and could end the turn or forge one (a prompt injection at the token level).
    """
    for token in sorted((t for t in special_tokens if len(t) > 1), key=len, reverse=True):
        text = text.replace(token, f"{token[0]} {token[1:]}")
    return text


def closing_token_text(tokenizer: Any, sampled_ids: Sequence[int]) -> str:
    """The text of a sampled turn's last token when it is a special token (servers return the end-of-turn token
    they sampled), else "": the `turn_closed_with` of `turn_glue`."""
    if sampled_ids and sampled_ids[-1] in set(getattr(tokenizer, "all_special_ids", [])):
        return str(tokenizer.convert_ids_to_tokens(sampled_ids[-1]))
    return ""


def turn_glue(tokenizer: Any, new_messages: Sequence[Mapping[str, Any]], *, turn_closed_with: str = "") -> str:
    """The text to insert after a sampled assistant turn so that `new_messages` (tool results, a user turn) follow
    it and the next assistant turn starts, as the chat template writes them.

    `turn_closed_with`: the text of the sampled turn's last token when it is the template's end-of-turn token
    (e.g. `<|im_end|>`, which the server returns as a sampled token; `closing_token_text`); the glue then leaves
    it out. A turn cut by a
    token limit or a stop string is closed by the glue. Message contents are neutralized (see
    `neutralize_special_tokens`).
    """
    specials = control_tokens(tokenizer)
    inserted = [{k: neutralize_special_tokens(v, specials) if isinstance(v, str) and k != "role" else v
                 for k, v in {**m, "content": str(m.get("content", ""))}.items()}
                for m in new_messages]
    base = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}]
    text = _render(tokenizer, base + inserted, add_generation_prompt=True)
    if text.count(_MARKER) != 1:
        raise ValueError("the chat template does not render an assistant message's content verbatim once; "
                         "rlkit cannot find where an assistant turn ends in it")
    glue = text.split(_MARKER, 1)[1]
    if turn_closed_with and glue.startswith(turn_closed_with):
        glue = glue[len(turn_closed_with):]
    return glue

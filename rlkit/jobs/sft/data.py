"""SFT rows -> token ids with a per-token loss mask, and their grouping into batches and micro-batches (pure).

No torch here: the tokenizer is any Hugging Face tokenizer (only `encode`, `apply_chat_template` and
`eos_token_id` are used), so the data side can be tested and inspected on a login node.

Mask convention: `loss_mask[t] == 1` means token t is a target, predicted from tokens 0..t-1 (token 0 never is).

Chat rows: the conversation is rendered to text with the chat template, and each trained assistant message is
located by rendering the conversation up to it twice: without it but with the generation prompt (where the model
starts writing) and with it (where the turn ends, end-of-turn marker included, so the model learns to stop). Both
must be text prefixes of the whole conversation; a template that renders earlier turns differently from the last
(e.g. one dropping earlier reasoning) fails that check, and the row is refused with a message rather than trained on
shifted masks. The text is then encoded piece by piece, cut at those boundaries: the mask is exact by construction,
and each prompt piece is encoded exactly as a server encodes that prompt at inference. A row's tools (sft.tools_key,
rlkit.data.chat_tools) go to every one of these renders, so each prefix holds them as the whole chat does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.config.schema.actor import MicroBatchSpec
from rlkit.config.schema.sft import SFTConfig
from rlkit.data.chat_tools import ignores_tools, row_tools
from rlkit.data.row_formats import sft_columns
from rlkit.errors import StepError
from rlkit.trainer.bins import packed_micro_batches


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: what the training step consumes (padded into tensors by rlkit.jobs.sft.loss)."""

    input_ids: list[int]
    loss_mask: list[int]  # 1: token is a target (see the module docstring)

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.input_ids)} tokens but {len(self.loss_mask)} mask entries")

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        """The target tokens the loss is taken over: position 0 is never one (no token predicts it), whatever its
        mask entry says, so the step's token count is the loss's own (rlkit.jobs.sft.loss.collate)."""
        return sum(self.loss_mask[1:])


@dataclass(frozen=True)
class SFTDataset:
    """The examples that fit, and how many rows max_length removed or cut (reported in the trainer log)."""

    examples: list[SFTExample]
    dropped: int
    truncated: int


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _render(tokenizer: Any, messages: list[dict[str, Any]], *, generation_prompt: bool,
            chat_template: str | None, tools: list[dict[str, Any]] | None = None) -> str:
    """The chat as the template writes it, with the row's tools (given to every render: a prefix rendered without
    them would not be a prefix of the whole). A template failing on a row is a ValueError (the row is named)."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                             chat_template=chat_template, tools=tools)
    except Exception as exc:  # Jinja's errors (raise_exception too), a TypeError of a value it cannot join
        raise ValueError(f"the chat template failed on this chat{' and its tools' if tools else ''}: "
                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(text, str):
        raise StepError(f"the chat template rendered {type(text).__name__}, not text")
    return text


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    """The chat, each message copied whole: the keys beyond role and content (an assistant's `tool_calls`, a tool
    result's `tool_call_id` or `name`) are the template's to read."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a chat must be a non-empty list of {role, content} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} is not a {{role: str, content: str}} mapping")
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, Mapping) for c in calls)):
            raise ValueError(f"message {i}'s tool_calls is not a list of {{function: ...}} mappings")
        # an assistant message that calls tools may have no text (OpenAI's form writes content null)
        if not isinstance(m.get("content"), str) and not (calls and m["role"] == "assistant"
                                                          and m.get("content") is None):
            raise ValueError(f"message {i} is not a {{role: str, content: str}} mapping")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the chat has no assistant message, so nothing to train on")
    return [dict(m) for m in messages]


def _turn_end(text: str, start: int, end: int, eos: str | None) -> int:
    """Where a target ends: after the turn's last EOS marker when it has one (the separator a template writes after
    it, such as a newline, is context, not something the model must learn to write), else at the turn's end."""
    at = text.rfind(eos, start, end) if eos else -1
    return at + len(eos) if eos and at >= 0 else end


def chat_example(messages: Any, tokenizer: Any, *, all_turns: bool, chat_template: str | None = None,
                 tools: list[dict[str, Any]] | None = None) -> SFTExample:
    """A chat with loss on its assistant messages (every one, or the last one only; those calling tools included,
    tool results never); `tools`: the function schemas the template is given. ValueError for a bad chat."""
    chat = _check_messages(messages)
    targets = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
    if not all_turns:
        targets = targets[-1:]
    whole = _render(tokenizer, chat, generation_prompt=False, chat_template=chat_template, tools=tools)
    if tools and ignores_tools(whole, lambda: _render(tokenizer, chat, generation_prompt=False,
                                                      chat_template=chat_template)):
        raise ValueError("the row has tools (sft.tools_key) but the chat template renders the chat the same "
                         "without them, so the model would learn to call tools it was never shown; give "
                         "sft.chat_template a template that renders `tools` (the model's tool-use template), or "
                         "set sft.tools_key='' to train without the tools column")
    cuts: list[tuple[int, int]] = []
    for i in targets:
        start = _render(tokenizer, chat[:i], generation_prompt=True, chat_template=chat_template, tools=tools)
        end = _render(tokenizer, chat[: i + 1], generation_prompt=False, chat_template=chat_template, tools=tools)
        if not whole.startswith(end):
            raise ValueError(f"the chat template renders the chat up to assistant message {i} differently from the "
                             "whole chat (it rewrites earlier turns), so that message's tokens cannot be located; "
                             "train on the last assistant message only (sft.enable_concatenated_multi_turn=false) "
                             "or split the chat into one row per assistant message")
        if not (end.startswith(start) and len(start) < len(end)):
            raise ValueError(f"the chat template's generation prompt is not the start of assistant message {i} as "
                             "the template writes it, so training text and inference prompts would differ; give "
                             "sft.chat_template a template whose generation prompt opens an assistant message")
        if cuts and len(start) < cuts[-1][1]:
            raise ValueError(f"assistant message {i} starts inside the previous one in the rendered chat")
        cuts.append((len(start), _turn_end(whole, len(start), len(end), getattr(tokenizer, "eos_token", None))))
    ids: list[int] = []
    mask: list[int] = []
    pos = 0
    for start_char, end_char in cuts:
        context = _encode(tokenizer, whole[pos:start_char])
        target = _encode(tokenizer, whole[start_char:end_char])
        ids += context + target
        mask += [0] * len(context) + [1] * len(target)
        pos = end_char
    tail = _encode(tokenizer, whole[pos:])
    return _example(ids + tail, mask + [0] * len(tail))


def _example(ids: list[int], mask: list[int]) -> SFTExample:
    """An example whose first token is no target: nothing before it predicts it (an empty prompt would otherwise
    mark the response's first token, which no loss position trains)."""
    return SFTExample(ids, [0, *mask[1:]] if mask else mask)


def plaintext_example(prompt: str, response: str, tokenizer: Any, *, apply_chat_template: bool,
                      system_prompt: str = "", chat_template: str | None = None,
                      tools: list[dict[str, Any]] | None = None) -> SFTExample:
    """A prompt and its response, with loss on the response: inside the chat template (a user and an assistant
    message, `tools` given to the template), or as raw text followed by the EOS token (what a base model's prompt
    looks like at inference; raw text has no place for tools)."""
    if apply_chat_template:
        chat = [{"role": "system", "content": system_prompt}] if system_prompt else []
        chat += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return chat_example(chat, tokenizer, all_turns=False, chat_template=chat_template, tools=tools)
    if tools:
        raise ValueError("the row has tools (sft.tools_key) but sft.apply_chat_template is false: raw text has no "
                         "place for them; set sft.apply_chat_template=true, or sft.tools_key='' to train without "
                         "the tools column")
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise StepError("the tokenizer has no EOS token, so a raw-text response cannot be ended; set "
                        "sft.apply_chat_template=true or use a tokenizer with an eos_token")
    context, target = _encode(tokenizer, prompt), [*_encode(tokenizer, response), int(eos)]
    return _example(context + target, [0] * len(context) + [1] * len(target))


def row_example(row: Mapping[str, Any], tokenizer: Any, sft: SFTConfig) -> SFTExample:
    """One dataset row in the format `sft` describes; ValueError naming the column for a row that does not fit."""
    template = sft.chat_template or None
    tools = row_tools(row, sft.tools_key)
    if sft.prompt_type == "messages":
        if sft.messages_key not in row:
            raise ValueError(f"no column '{sft.messages_key}' (sft.messages_key)")
        return chat_example(row[sft.messages_key], tokenizer, all_turns=sft.enable_concatenated_multi_turn,
                            chat_template=template, tools=tools)
    values = {}
    columns = sft_columns(row, sft.prompt_key, sft.response_key)  # GSM8K's question/answer (rlkit.data.row_formats)
    for field, key in zip(("prompt_key", "response_key"), columns, strict=True):
        if not isinstance(row.get(key), str):
            raise ValueError(f"column '{key}' (sft.{field}) is missing or not a string")
        values[field] = row[key]
    system = sft.system_prompt
    if sft.system_prompt_key and row.get(sft.system_prompt_key):
        system = str(row[sft.system_prompt_key])
    return plaintext_example(values["prompt_key"], values["response_key"], tokenizer,
                             apply_chat_template=sft.apply_chat_template, system_prompt=system,
                             chat_template=template, tools=tools)


def fit_length(example: SFTExample, max_length: int | None, *, truncate: bool) -> SFTExample | None:
    """The example as max_length allows: unchanged, cut to max_length (`truncate`), or None (dropped; also when
    cutting leaves no target token)."""
    if max_length is None or example.length <= max_length:
        return example
    if not truncate:
        return None
    cut = SFTExample(example.input_ids[:max_length], example.loss_mask[:max_length])
    return cut if cut.n_targets else None


def tokenize_rows(rows: Iterable[Mapping[str, Any]], tokenizer: Any, sft: SFTConfig, *, max_length: int | None,
                  source: str = "dataset") -> SFTDataset:
    """Every row as an example (in row order); a row that does not fit the format is a StepError naming it."""
    examples: list[SFTExample] = []
    dropped = truncated = 0
    for n, row in enumerate(rows):
        try:
            example = row_example(row, tokenizer, sft)
        except ValueError as exc:
            raise StepError(f"{source}: row {n}: {exc}") from None
        fitted = fit_length(example, max_length, truncate=sft.truncate)
        if fitted is None or not fitted.n_targets:
            dropped += 1
            continue
        truncated += fitted is not example
        examples.append(fitted)
    return SFTDataset(examples, dropped, truncated)


def rank_share(batch: Sequence[int], lengths: Sequence[int], world: int) -> list[list[int]]:
    """Split one global batch over `world` ranks with about equal token counts (longest first, each to the rank with
    the fewest tokens so far). A rank may get nothing when the batch has fewer rows than ranks."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(batch, key=lambda j: (-lengths[j], j)):
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += lengths[i]
    return [sorted(share) for share in shares]


def micro_batches(indices: Sequence[int], lengths: Sequence[int], *, max_tokens: int | None,
                  n_mbs: int = 1) -> list[list[int]]:
    """Group `indices` into micro-batches of at most `max_tokens` padded tokens (rows x longest row: the trainer
    pads each micro-batch to its longest row), first fit in decreasing length (AReaL's ffd), then split further
    until there are at least `n_mbs` (when there are that many rows). Without a budget: `n_mbs` groups of about
    equal size. A row longer than the budget is a ValueError (validation keeps max_length within it)."""
    items = sorted(indices, key=lambda j: (-lengths[j], j))
    if not items:
        return []
    bins: list[list[int]] = []
    if max_tokens is None:
        bins = [items[k :: max(1, n_mbs)] for k in range(min(max(1, n_mbs), len(items)))]
    else:
        for i in items:
            if lengths[i] > max_tokens:
                raise ValueError(f"a row of {lengths[i]} tokens exceeds the micro-batch budget of {max_tokens}")
            # bins[b][0] is the bin's longest row (rows arrive longest first)
            home = next((b for b in bins if (len(b) + 1) * lengths[b[0]] <= max_tokens), None)
            if home is None:
                bins.append([i])
            else:
                home.append(i)
    while len(bins) < min(n_mbs, len(items)):
        largest = max(range(len(bins)), key=lambda b: (len(bins[b]), -b))
        half = len(bins[largest]) // 2
        bins[largest], extra = bins[largest][:half], bins[largest][half:]
        bins.append(extra)
    return [sorted(b) for b in bins]


def rank_micro_batches(batch: Sequence[int], lengths: Sequence[int], *, rank: int, world: int,
                       max_tokens: int | None, n_mbs: int = 1, spec: MicroBatchSpec | None = None
                       ) -> tuple[list[list[int]], int]:
    """This rank's micro-batches of one global batch, and how many dummy micro-batches it must add so that every
    rank runs the same number (FSDP's collectives pair up). Every rank holds the whole dataset, so each computes
    every rank's split itself: no collective is needed to agree on the count. With a packing `spec` the micro-batches
    are packed ones, balanced by real tokens (its max_tokens_per_mb and n_mbs then replace the arguments)."""
    if spec is not None and spec.packing:
        per_rank = [_packed(share, lengths, spec) for share in rank_share(batch, lengths, world)]
        count = -(-max(len(mbs) for mbs in per_rank) // spec.n_mbs_divisor) * spec.n_mbs_divisor
    else:
        per_rank = [micro_batches(share, lengths, max_tokens=max_tokens, n_mbs=n_mbs)
                    for share in rank_share(batch, lengths, world)]
        count = max(len(mbs) for mbs in per_rank)
    mine = per_rank[rank]
    return mine, count - len(mine)


def _packed(share: Sequence[int], lengths: Sequence[int], spec: MicroBatchSpec) -> list[list[int]]:
    bins = packed_micro_batches([lengths[i] for i in share], max_tokens=spec.max_tokens_per_mb, n_mbs=spec.n_mbs,
                                divisor=spec.n_mbs_divisor, algorithm=spec.packing_algorithm)
    return [[share[j] for j in b] for b in bins]


def load_sft_dataset(path: str, tokenizer: Any, sft: SFTConfig, *, max_length: int | None) -> SFTDataset:
    """A local sft dataset (jsonl/json/parquet file or directory), tokenized; rows that do not fit are StepErrors."""
    from rlkit.data.files import load_rows

    return tokenize_rows(load_rows(path), tokenizer, sft, max_length=max_length, source=path)

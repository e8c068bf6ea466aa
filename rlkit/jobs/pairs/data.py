"""Preference pairs as tokens (torch-free): a row's prompt, chosen and rejected answer become two sequences that
share the prompt's tokens, each with a mask of its answer tokens (what the rw score and the dpo log-probs read).

The prompt is tokenized once and each answer after it, so both sequences carry the very same prompt ids: a pair
differs only in its answers, which is what a pairwise loss compares. Chat rows (a list of messages) go through the
tokenizer's chat template; the answer is what the template adds after the prompt's generation prompt, so its
closing tokens (end of turn) are part of the answer. A plain-text answer gets the end-of-sequence token appended,
so that a model trained on pairs also learns to stop.

The prompt + answer split itself (`prompt_ids`, `answer_ids`) is rlkit.data.answer_tokens, shared with the reward
model's scoring (rlkit.rewards.model_reward).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rlkit.data.answer_tokens import answer_ids, prompt_ids
from rlkit.data.row_formats import pair_row
from rlkit.errors import StepError

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import DatasetConfig
    from rlkit.config.schema.pairs import PairDataConfig

Side = Literal["chosen", "rejected"]


@dataclass(frozen=True)
class Pair:
    """One row's two sequences: the shared prompt and each answer's tokens. `index` is the row's position in the
    dataset (the key under which the frozen reference's log-probs of this pair are kept)."""

    index: int
    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]

    def answer(self, side: Side) -> tuple[int, ...]:
        return self.chosen_ids if side == "chosen" else self.rejected_ids

    def sequence(self, side: Side) -> tuple[list[int], list[bool]]:
        """The token ids of prompt + answer, and per token whether it belongs to the answer (the loss mask)."""
        answer = self.answer(side)
        return [*self.prompt_ids, *answer], [False] * len(self.prompt_ids) + [True] * len(answer)

    @property
    def length(self) -> int:
        """Tokens of the longer of the two sequences (what a length limit and micro-batch budgets count)."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


@dataclass
class PairCounts:
    """What building the pairs did to the rows (logged at the job's start, so silent data loss shows)."""

    kept: int = 0
    truncated: int = 0
    dropped: list[int] = field(default_factory=list)  # row indices too long (or with an empty answer)


def encode_pair(tokenizer: Any, row: dict[str, Any], index: int, *, prompt_key: str, chosen_key: str,
                rejected_key: str) -> Pair:
    """Tokenize one row; StepError naming the row and column for a row that cannot be read."""
    row = dict(pair_row(row, prompt_key, chosen_key, rejected_key))  # hh-rlhf's conversations (rlkit.data.row_formats)
    try:
        for key in (prompt_key, chosen_key, rejected_key):
            if key not in row:
                raise StepError(f"no column '{key}' (columns: {', '.join(row)})")
        prompt = prompt_ids(tokenizer, row[prompt_key])
        chosen = answer_ids(tokenizer, row[prompt_key], row[chosen_key], prompt)
        rejected = answer_ids(tokenizer, row[prompt_key], row[rejected_key], prompt)
    except StepError as exc:
        raise StepError(f"pair dataset row {index}: {exc}") from None
    return Pair(index, tuple(prompt), tuple(chosen), tuple(rejected))


def fit_length(pair: Pair, max_length: int | None, *, truncate_prompt: bool) -> Pair | None:
    """`pair` if both sequences have at most `max_length` tokens; else, with `truncate_prompt`, the pair with the
    prompt's oldest tokens cut so that they do (at least one prompt token stays); else None (dropped)."""
    if max_length is None or pair.length <= max_length:
        return pair
    longest_answer = max(len(pair.chosen_ids), len(pair.rejected_ids))
    keep = max_length - longest_answer
    if not truncate_prompt or keep < 1:
        return None
    return Pair(pair.index, pair.prompt_ids[len(pair.prompt_ids) - keep:], pair.chosen_ids, pair.rejected_ids)


def build_pairs(rows: Iterable[dict[str, Any]], tokenizer: Any, *, prompt_key: str, chosen_key: str,
                rejected_key: str, max_length: int | None, truncate_prompt: bool) -> tuple[list[Pair], PairCounts]:
    """Every row as a Pair (row order kept), rows too long for `max_length` cut or dropped; and what was done.
    A row whose two answers tokenize the same is dropped too: it carries no preference."""
    pairs: list[Pair] = []
    counts = PairCounts()
    for index, row in enumerate(rows):
        pair = encode_pair(tokenizer, row, index, prompt_key=prompt_key, chosen_key=chosen_key,
                           rejected_key=rejected_key)
        fitted = fit_length(pair, max_length, truncate_prompt=truncate_prompt)
        if fitted is None or not pair.chosen_ids or not pair.rejected_ids or pair.chosen_ids == pair.rejected_ids:
            counts.dropped.append(index)
            continue
        counts.truncated += fitted is not pair
        pairs.append(fitted)
    counts.kept = len(pairs)
    return pairs, counts


def pairs_from_config(dataset: DatasetConfig, section: PairDataConfig, tokenizer: Any
                      ) -> tuple[list[Pair], PairCounts]:
    """The pairs of a configured dataset (`train_dataset` or `valid_dataset`) with the `rw`/`dpo` section's keys."""
    from rlkit.data.files import load_rows

    return pairs_from_rows(load_rows(dataset.path), dataset, section, tokenizer)


def pairs_from_rows(rows: Sequence[dict[str, Any]], dataset: DatasetConfig, section: PairDataConfig, tokenizer: Any
                    ) -> tuple[list[Pair], PairCounts]:
    """build_pairs with a dataset's prompt column and length limit and a section's keys; StepError when no row is
    left (every one too long for max_length, or without a preference)."""
    pairs, counts = build_pairs(rows, tokenizer, prompt_key=dataset.prompt_key, chosen_key=section.chosen_key,
                                rejected_key=section.rejected_key, max_length=dataset.max_length,
                                truncate_prompt=section.truncate_prompt)
    if not pairs:
        raise StepError(f"{dataset.path}: none of its {len(counts.dropped)} rows is a usable pair (longer than "
                        f"max_length={dataset.max_length} tokens, or the same answer twice)")
    return pairs, counts

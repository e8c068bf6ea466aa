"""Token-exact multi-turn trajectories: the ids the trainer trains on are the ids the servers sampled.

Why not keep the conversation as chat messages and tokenize it again for training, as many agent loops do?
Because text -> tokens is not the inverse of tokens -> text:

- BPE merges across boundaries and normalizes spellings. A policy may sample a word in unusual pieces (a tiny
  random model samples `<tool_call>` byte by byte) and a turn may end in a space that the inserted text then
  follows (` ` + `seven`); tokenizing the conversation again gives the canonical pieces (fewer of them, and
  ` seven` as one token). The trainer would compute log-probs of tokens the policy never chose, and their
  importance ratio against the server's log-probs means nothing (tests/unit/agent/test_agent_trajectory.py shows both
  with the tiny tokenizer).
- Chat templates do not round-trip: rendering the assistant's message again may strip whitespace, drop or
  rewrite reasoning, re-serialize tool calls from parsed JSON (other key order, other spacing), add a default
  system message, or close the last turn with a newline nobody sampled; decoding may skip special tokens.

So an episode is built here as segments appended in order after the prompt: sampled segments keep the ids and
log-probs exactly as the server returned them (with the weight version they were sampled at), inserted segments
(tool results, user turns, the template's glue between turns) are tokenized once by rlkit and masked out of the
loss. Segments are never merged: the next request is the prompt plus every segment's ids, concatenated, so the
server continues from exactly the tokens the trainer will see. The builder checks this at every step and raises
`TrajectoryMismatch` on any difference instead of training on tokens nobody sampled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.errors import StepError

INSERTED_VERSION = -1  # weight version of inserted tokens (no policy produced them; they are masked)
MAX_TURNS, MAX_TOTAL_TOKENS, MAX_TOKENS_PER_TURN = "max_turns", "max_total_tokens", "max_tokens_per_turn"


_PROBE_CHARS_PER_TOKEN, _PROBE_MARGIN = 16, 64


def encode_within(tokenizer: Any, text: str, limit: int) -> list[int] | None:
    """`text`'s token ids, or None when there are more than `limit`. A text far past the limit is found so from a
    prefix, not tokenized whole: an agent's 16 MB conversation took 18 s to tokenize on the rollout's event loop,
    which answered nothing else meanwhile (other episodes, the servers' health probes). A prefix's count differs
    from its share of the whole's only at the cut, by far less than the margin."""
    probe = max(0, limit) * _PROBE_CHARS_PER_TOKEN + _PROBE_MARGIN
    if len(text) > probe and len(tokenizer.encode(text[:probe], add_special_tokens=False)) > limit + _PROBE_MARGIN:
        return None
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids if len(ids) <= limit else None


class TrajectoryMismatch(StepError):
    """The tokens of a trajectory differ from what a server was sent or returned: training on them would train on
    tokens no policy sampled. A bug in the workflow or the client, never something to skip."""


@dataclass(frozen=True)
class TrajectoryLimits:
    """How long an episode may grow. `max_total_tokens` counts the prompt and everything after it."""

    max_turns: int
    max_total_tokens: int
    max_tokens_per_turn: int

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in vars(self).items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise ValueError(f"trajectory limits must be positive integers: {', '.join(bad)}")


@dataclass(frozen=True)
class SampledSegment:
    """Tokens a server sampled in one request, as it returned them. `start`: offset after the prompt."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int
    finish_reason: str
    start: int


@dataclass(frozen=True)
class InsertedSegment:
    """Text rlkit inserted (tool results, a user turn, the template's glue), tokenized once, never trained on."""

    token_ids: tuple[int, ...]
    text: str
    start: int


Segment = SampledSegment | InsertedSegment


@dataclass(frozen=True)
class TurnRequest:
    """The next generate call: send exactly `request_ids`, ask for at most `max_new_tokens`."""

    turn: int
    request_ids: tuple[int, ...]
    max_new_tokens: int
    limited_by_total: bool  # the total-token limit, not the per-turn one, set max_new_tokens


@dataclass(frozen=True)
class Trajectory:
    """A finished episode's tokens after the prompt, with per-token mask, behaviour log-probs and versions."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]  # 1: sampled (trained), 0: inserted
    behav_logp: tuple[float, ...]  # the server's log-prob on sampled tokens, 0.0 on inserted
    versions: tuple[int, ...]  # the weight version a sampled token was sampled at; INSERTED_VERSION on inserted
    segments: tuple[Segment, ...]
    truncated: bool
    truncation_reason: str  # "" or one of max_turns, max_total_tokens, max_tokens_per_turn
    turns: int  # sampled segments


def _first_difference(a: Sequence[int], b: Sequence[int]) -> str:
    """Where two id sequences part, with a few ids of context each, for the mismatch message."""
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (f"lengths {len(a)} and {len(b)}, first difference at position {n}: "
            f"{list(a[max(0, n - 3):n + 3])} vs {list(b[max(0, n - 3):n + 3])}")


class TrajectoryBuilder:
    """Appends an episode's segments in order and checks every request and completion against them.

    Use: `turn = b.start_turn()` (None: a limit ends the episode, flagged truncated), send `turn.request_ids`,
    `b.add_sampled(turn, ids, logprobs, ...)`, then `b.add_inserted(text)` for what follows, and `b.build()`.
    `tokenizer`: a Hugging Face tokenizer (only `encode` is used, on inserted text). `vocab_size`: the model's
    (often larger than the tokenizer's: padded embeddings); sampled ids must be below it.
    """

    def __init__(self, prompt_ids: Sequence[int], limits: TrajectoryLimits, tokenizer: Any, *,
                 vocab_size: int | None = None) -> None:
        if not prompt_ids:
            raise ValueError("a trajectory needs a non-empty prompt")
        self.prompt_ids = tuple(prompt_ids)
        self.vocab_size = vocab_size
        self.limits = limits
        self.tokenizer = tokenizer
        self.segments: list[Segment] = []
        self._ids: list[int] = []
        self._pending: TurnRequest | None = None
        self.turns = 0
        self.truncation_reason = ""

    @property
    def truncated(self) -> bool:
        return bool(self.truncation_reason)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self._ids)

    def truncate(self, reason: str) -> None:
        """Flag the episode as cut by a limit (the first reason is kept)."""
        self.truncation_reason = self.truncation_reason or reason

    def context_ids(self) -> tuple[int, ...]:
        """The prompt and every segment so far: what the next request continues."""
        return self.prompt_ids + tuple(self._ids)

    def next_turn_budget(self) -> int:
        """How many tokens the next generate call may ask for (0: no turn or no room left)."""
        if self.truncated or self.turns >= self.limits.max_turns:
            return 0
        return max(0, min(self.limits.max_tokens_per_turn, self.limits.max_total_tokens - self.total_tokens))

    def start_turn(self) -> TurnRequest | None:
        """The next request, or None when the episode may not go on (flagged truncated: the model wanted another
        turn, a limit said no)."""
        if self.truncated:
            return None
        if self.turns >= self.limits.max_turns:
            self.truncate(MAX_TURNS)
            return None
        room = self.limits.max_total_tokens - self.total_tokens
        if room <= 0:
            self.truncate(MAX_TOTAL_TOKENS)
            return None
        budget = min(self.limits.max_tokens_per_turn, room)
        self._pending = TurnRequest(self.turns, self.context_ids(), budget,
                                    limited_by_total=room < self.limits.max_tokens_per_turn)
        return self._pending

    def add_sampled(self, turn: TurnRequest, token_ids: Sequence[int], logprobs: Sequence[float], *,
                    version: int, finish_reason: str, server_request_ids: Sequence[int] | None = None) -> None:
        """Append what the server returned for `turn`. `server_request_ids`: the prompt ids the server reports it
        was given (when its response carries them). TrajectoryMismatch on any difference."""
        where = f"turn {turn.turn}"
        if self._pending is None or turn != self._pending:
            raise TrajectoryMismatch(f"{where}: add_sampled for a request that is not the pending one (pending: "
                                     f"{None if self._pending is None else self._pending.turn})")
        if turn.request_ids != self.context_ids():
            raise TrajectoryMismatch(f"{where}: the trajectory changed after the request was made: "
                                     f"{_first_difference(turn.request_ids, self.context_ids())}")
        if server_request_ids is not None and tuple(server_request_ids) != turn.request_ids:
            raise TrajectoryMismatch(f"{where}: the server reports other prompt ids than it was sent: "
                                     f"{_first_difference(turn.request_ids, list(server_request_ids))}")
        ids, logps = tuple(token_ids), tuple(float(x) for x in logprobs)
        if len(ids) != len(logps):
            raise TrajectoryMismatch(f"{where}: {len(ids)} token ids but {len(logps)} log-probs")
        if len(ids) > turn.max_new_tokens:
            raise TrajectoryMismatch(f"{where}: the server returned {len(ids)} tokens, more than the "
                                     f"{turn.max_new_tokens} asked for")
        vocab = self.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or (vocab is not None and t >= vocab)
               for t in ids):
            raise TrajectoryMismatch(f"{where}: a token id is not an integer in [0, {vocab or 'inf'}): "
                                     f"{list(ids)[:20]}")
        if any(math.isnan(x) for x in logps):
            raise TrajectoryMismatch(f"{where}: the server returned NaN log-probs")
        self.segments.append(SampledSegment(ids, logps, version, finish_reason, len(self._ids)))
        self._ids.extend(ids)
        self._pending = None
        self.turns += 1
        if finish_reason == "length" and turn.limited_by_total and len(ids) >= turn.max_new_tokens:
            self.truncate(MAX_TOTAL_TOKENS)  # no room for another turn
        # A turn cut by max_tokens_per_turn does not end the episode: the template's glue closes it and the workflow
        # decides (a cut tool call gets its error message and another turn). An episode whose LAST turn was cut is
        # flagged at build(), like an overlong single-turn sample.

    def add_inserted(self, text: str) -> bool:
        """Tokenize `text` once and append it, masked; False (nothing appended, flagged truncated) when it would
        pass max_total_tokens."""
        if self._pending is not None:
            raise TrajectoryMismatch(f"turn {self._pending.turn}: text inserted while its request is in flight")
        if not text:
            return True
        ids = encode_within(self.tokenizer, text, self.limits.max_total_tokens - self.total_tokens)
        if ids is None:
            self.truncate(MAX_TOTAL_TOKENS)
            return False
        return self.add_inserted_ids(ids, text)

    def add_inserted_ids(self, token_ids: Sequence[int], text: str) -> bool:
        """Append ids a client tokenized itself (the token-level route: verifiers renders its own turns), masked;
        False (nothing appended, flagged truncated) when they would pass max_total_tokens."""
        if self._pending is not None:
            raise TrajectoryMismatch(f"turn {self._pending.turn}: tokens inserted while its request is in flight")
        ids = tuple(token_ids)
        if not ids:
            return True
        if self.total_tokens + len(ids) > self.limits.max_total_tokens:
            self.truncate(MAX_TOTAL_TOKENS)
            return False
        self.segments.append(InsertedSegment(ids, text, len(self._ids)))
        self._ids.extend(ids)
        return True

    def verify(self) -> None:
        """Every segment's ids sit, unchanged and unmerged, at their place in the flat sequence, and the segments
        tile it exactly; TrajectoryMismatch naming the first segment that does not."""
        position = 0
        for index, segment in enumerate(self.segments):
            kind = "sampled" if isinstance(segment, SampledSegment) else "inserted"
            if segment.start != position:
                raise TrajectoryMismatch(f"segment {index} ({kind}) starts at {segment.start}, expected {position}")
            placed = self._ids[position:position + len(segment.token_ids)]
            if tuple(placed) != segment.token_ids:
                raise TrajectoryMismatch(f"segment {index} ({kind}) differs from the trajectory's ids: "
                                         f"{_first_difference(segment.token_ids, placed)}")
            position += len(segment.token_ids)
        if position != len(self._ids):
            raise TrajectoryMismatch(f"the segments cover {position} ids, the trajectory has {len(self._ids)}")

    def build(self) -> Trajectory:
        """The verified trajectory (a request still in flight is a workflow bug: TrajectoryMismatch)."""
        if self._pending is not None:
            raise TrajectoryMismatch(f"turn {self._pending.turn}: build() while its request is in flight")
        self.verify()
        mask: list[int] = []
        logp: list[float] = []
        versions: list[int] = []
        for segment in self.segments:
            n = len(segment.token_ids)
            if isinstance(segment, SampledSegment):
                mask += [1] * n
                logp += segment.logprobs
                versions += [segment.version] * n
            else:
                mask += [0] * n
                logp += [0.0] * n
                versions += [INSERTED_VERSION] * n
        reason = self.truncation_reason
        sampled = [s for s in self.segments if isinstance(s, SampledSegment)]
        if not reason and sampled and sampled[-1].finish_reason == "length":
            reason = MAX_TOKENS_PER_TURN  # the episode ended on a turn cut short: its answer may be incomplete
        return Trajectory(self.prompt_ids, tuple(self._ids), tuple(mask), tuple(logp), tuple(versions),
                          tuple(self.segments), bool(reason), reason, self.turns)

"""Scoring given token sequences with a server's prompt-logprob route (`ServerBackend.score_tokens`): a distillation
teacher's log-probs of the student's sampled tokens and its top-k per position. The request bodies and the parsing of
the answers of both engines, kept apart from their backends' weight and sampling code.

vLLM 0.32: `POST /v1/completions {"prompt": [[ids], ...], "max_tokens": 1, "prompt_logprobs": k}`; each choice's
`prompt_logprobs` is `[null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]`, one dict per prompt token
holding the token itself and the k most likely (rank 1..k), raw log-softmax of the logits. k is bounded by the
server's --max-logprobs (20 by default). SGLang 0.5.23: `POST /generate {"input_ids": [[ids], ...],
"return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": k}` answers a list; each `meta_info` has
`input_token_logprobs` `[[logprob, id, null], ...]` (the first logprob null) and `input_top_logprobs`, a list per
position of `[[logprob, id, null], ...]` (the first entry null).
"""

from __future__ import annotations

import math
from typing import Any

from rlkit.errors import StepError
from rlkit.servers.backend import Server, TokenScores

_LOGPROB_SLACK = 1e-3  # a log-softmax is <= 0; a little above is float rounding of a certain token


def vllm_body(server: Server, sequences: list[list[int]], topk: int) -> dict[str, Any]:
    # prompt_logprobs 0 still returns the token's own log-prob; max_tokens 1 is the least the route generates
    return {"model": server.model, "prompt": sequences, "max_tokens": 1, "temperature": 0, "prompt_logprobs": topk}


def vllm_scores(answer: Any, server: Server, sequences: list[list[int]], starts: list[int],
                topk: int) -> list[TokenScores]:
    """The TokenScores of each sequence from vLLM's answer; StepError naming what is missing."""
    try:
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        entries_of = [choice["prompt_logprobs"] for choice in choices]
    except (KeyError, TypeError) as exc:
        raise StepError(f"{server.label}: the scoring answer has no choices with prompt_logprobs: "
                        f"{str(answer)[:300]}") from exc
    if len(entries_of) != len(sequences):
        raise StepError(f"{server.label}: {len(sequences)} sequences scored, {len(entries_of)} answered")
    out = []
    for seq, start, entries in zip(sequences, starts, entries_of, strict=True):
        if not isinstance(entries, list) or len(entries) != len(seq):
            raise StepError(f"{server.label}: prompt_logprobs cover {len(entries) if isinstance(entries, list) else 0}"
                            f" of {len(seq)} tokens")
        try:
            out.append(_vllm_sequence(entries, seq, start, topk, server))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # an entry of another shape
            raise StepError(f"{server.label}: the scoring answer has a malformed prompt_logprobs entry "
                            f"({type(exc).__name__}: {exc})") from exc
    return out


def _vllm_sequence(entries: list[Any], seq: list[int], start: int, topk: int, server: Server) -> TokenScores:
    logprobs, tops = [], []
    for position in range(start, len(seq)):
        entry = entries[position] or {}
        own = entry.get(str(seq[position]))
        if own is None:
            raise StepError(f"{server.label}: no log-prob of token {seq[position]} at position {position}")
        logprobs.append(_logprob(own["logprob"], server, position))
        if topk:
            ranked = sorted(((int(v["rank"]), int(k), _logprob(v["logprob"], server, position))
                             for k, v in entry.items() if int(v["rank"]) <= topk), key=lambda r: r[0])
            tops.append(_exactly(topk, [(token, lp) for _, token, lp in ranked], server, position))
    return TokenScores(logprobs, tops)


def _logprob(value: Any, server: Server, position: int) -> float:
    """`value` as a log-prob; StepError for NaN, infinity or a positive one (a teacher in fp16 that overflowed):
    the distillation loss would turn NaN without an error."""
    result = float(value)
    if not (math.isfinite(result) and result <= _LOGPROB_SLACK):
        raise StepError(f"{server.label}: the log-prob {result} at position {position} is not a finite number <= 0")
    return result


def sglang_body(sequences: list[list[int]], topk: int, extra: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": sequences, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                            "return_logprob": True, "logprob_start_len": 0, **extra}
    if topk:
        body["top_logprobs_num"] = topk
    return body


def sglang_scores(answer: Any, server: Server, sequences: list[list[int]], starts: list[int],
                  topk: int) -> list[TokenScores]:
    """The TokenScores of each sequence from SGLang's answer (a list, one result per sequence)."""
    results = answer if isinstance(answer, list) else [answer]
    if len(results) != len(sequences):
        raise StepError(f"{server.label}: {len(sequences)} sequences scored, {len(results)} answered")
    out = []
    for seq, start, result in zip(sequences, starts, results, strict=True):
        try:
            meta = result["meta_info"]
            values = [entry[0] for entry in meta["input_token_logprobs"]]
            tops_all = meta.get("input_top_logprobs") or [] if topk else []
        except (KeyError, TypeError, IndexError) as exc:
            raise StepError(f"{server.label}: the scoring answer has no input_token_logprobs: "
                            f"{str(result)[:300]}") from exc
        if len(values) != len(seq) or any(v is None for v in values[start:]):
            raise StepError(f"{server.label}: input_token_logprobs cover {len(values)} of {len(seq)} tokens")
        tops = []
        if topk:
            if len(tops_all) != len(seq):
                raise StepError(f"{server.label}: input_top_logprobs cover {len(tops_all)} of {len(seq)} tokens")
            for position in range(start, len(seq)):
                try:
                    pairs = sorted(((int(e[1]), _logprob(e[0], server, position)) for e in tops_all[position] or []),
                                   key=lambda p: -p[1])
                except (KeyError, TypeError, IndexError, ValueError) as exc:
                    raise StepError(f"{server.label}: the scoring answer has a malformed input_top_logprobs entry "
                                    f"at position {position} ({type(exc).__name__}: {exc})") from exc
                tops.append(_exactly(topk, pairs, server, position))
        try:
            logprobs = [_logprob(v, server, start + i) for i, v in enumerate(values[start:])]
        except (TypeError, ValueError) as exc:
            raise StepError(f"{server.label}: the scoring answer has a malformed log-prob ({exc})") from exc
        out.append(TokenScores(logprobs, tops))
    return out


def _exactly(topk: int, pairs: list[tuple[int, float]], server: Server, position: int) -> list[tuple[int, float]]:
    if len(pairs) < topk:
        raise StepError(f"{server.label}: {len(pairs)} top log-probs at position {position}, asked for {topk}")
    return pairs[:topk]

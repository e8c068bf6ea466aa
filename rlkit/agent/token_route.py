"""The token-level route of the agent endpoint: `POST /e/<key>/inference/v1/generate`, as verifiers' train client
calls it (renderers' `generate`: `{model, token_ids, sampling_params}` in; `choices[0].token_ids` and per-token
log-probs as `"token_id:<id>"` out).

Why rlkit serves it instead of pointing the client at vLLM's own route: vLLM 0.32 does serve
`/inference/v1/generate` (with `--enable-scale-out`), but its default `output_mode: tokens` answers each log-prob as
`{"token_id": N}`, which verifiers 0.4.0's renderers reject ("must be 'token_id:N'"); and a call through rlkit is
sampled like every rollout turn (the least-busy live server, no request during a weight push, tagged with its weight
version) and recorded as the episode's token-exact trajectory. The client renders its own turns, so rlkit tokenizes
nothing here: a call whose ids continue the trajectory (its prompt, every segment, then new ids) inserts the new ids
masked, as given; any other call starts a new trajectory from its ids (counted, as on the chat route).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from rlkit.agent.context import EpisodeContext
from rlkit.agent.openai_protocol import OpenAIError

GCONFIG_SETTINGS = ("temperature", "top_p", "top_k")  # a call may repeat them, never change them
IGNORED_SETTINGS = ("logprobs", "skip_special_tokens", "detokenize", "seed")  # log-probs always come back; ids only
REQUEST_KEYS = {"model", "token_ids", "sampling_params", "cache_salt", "priority", "stream"}


@dataclass(frozen=True)
class TokenRequest:
    """One checked call of the token-level route."""

    token_ids: list[int]
    max_tokens: int | None
    stop_token_ids: list[int]


class EpisodeSession(Protocol):
    """What the route needs of an endpoint session (rlkit.agent.openai_endpoint.AgentSession)."""

    key: str
    ctx: EpisodeContext
    calls: int
    segments: int
    lock: asyncio.Lock
    closed: bool


def _bad(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_token_request(body: Any, gconfig: dict[str, float | int], stop_ids: set[int]) -> TokenRequest:
    """The call as rlkit serves it, or OpenAIError naming the first thing it cannot honour. `gconfig`: the run's
    temperature, top_p and top_k; `stop_ids`: the token ids the servers stop at (the tokenizer's end of sequence)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    unknown = sorted(set(body) - REQUEST_KEYS)
    if unknown:
        raise _bad(f"rlkit's token route does not serve {', '.join(unknown)} (text-only token ids: no multimodal "
                   "content_parts or features)", param=unknown[0])
    if body.get("stream"):
        raise _bad("rlkit's token route does not stream", param="stream")
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(_is_int(i) and 0 <= i < 2**31 for i in ids):
        raise _bad("token_ids must be a non-empty list of token ids (integers from 0 below 2**31)", param="token_ids")
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise _bad("sampling_params must be an object", param="sampling_params")
    for name, value in sampling.items():
        if name in GCONFIG_SETTINGS:
            if value is not None and value != gconfig[name]:
                raise _bad(f"sampling_params.{name}={value!r}: the run samples at {name}={gconfig[name]!r} "
                           "(gconfig's, or eval_gconfig's in an evaluation): the trainer's log-probs are taken at "
                           "those sampling settings, so a call may repeat them but not change them", param=name)
        elif name not in (*IGNORED_SETTINGS, "max_tokens", "stop_token_ids"):
            raise _bad(f"sampling_params.{name} is not served by rlkit's token route (it takes max_tokens and "
                       f"stop_token_ids; {', '.join(GCONFIG_SETTINGS)} are the run's)", param=name)
    max_tokens = sampling.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise _bad(f"sampling_params.max_tokens={max_tokens!r}: give a positive integer", param="max_tokens")
    stops = sampling.get("stop_token_ids") or []
    if not isinstance(stops, list) or not all(_is_int(i) for i in stops):
        raise _bad("sampling_params.stop_token_ids must be a list of token ids", param="stop_token_ids")
    other = sorted(set(stops) - stop_ids)
    if other:
        raise _bad(f"sampling_params.stop_token_ids {other}: rlkit's servers stop only at {sorted(stop_ids)} (the "
                   "tokenizer's end of sequence); a client's renderer must stop where the model's template ends a "
                   "turn", param="stop_token_ids")
    return TokenRequest(list(ids), max_tokens, list(stops))


async def generate_tokens(session: EpisodeSession, request: TokenRequest) -> dict[str, Any]:
    """One call, one sampled turn of `session`'s episode (calls of one episode are taken one at a time)."""
    async with session.lock:
        if session.closed:
            raise OpenAIError(401, "this episode has ended; its key is no longer valid", code="invalid_api_key",
                              kind="authentication_error")
        session.calls += 1
        ctx = session.ctx
        vocab = ctx.services.vocab_size
        if vocab is not None and max(request.token_ids) >= vocab:  # a server would refuse it: the caller's error
            raise _bad(f"token_ids holds {max(request.token_ids)}, not a token id of this model (vocabulary of "
                       f"{vocab})", param="token_ids")
        context = list(ctx.builder.context_ids()) if session.segments else []
        if context and request.token_ids[:len(context)] == context:
            tail = request.token_ids[len(context):]
            fits = ctx.builder.add_inserted_ids(tail, ctx.tokenizer.decode(tail))
        else:
            limit = ctx.services.limits.max_total_tokens
            if len(request.token_ids) >= limit:
                raise OpenAIError(400, f"token_ids holds {len(request.token_ids)} tokens; an episode may hold {limit} "
                                       "(rollout.agent.engine_max_tokens or the servers' context), leaving no room "
                                       "for a turn", param="token_ids", code="context_length_exceeded")
            ctx.restart(request.token_ids, ctx.tokenizer.decode(request.token_ids))
            session.segments += 1
            fits = True
        settings = {} if request.max_tokens is None else {"max_new_tokens": request.max_tokens}
        turn = await ctx.generate(**settings) if fits else None
        ids = list(turn.token_ids) if turn is not None else []
        segment = ctx.builder.segments[-1] if turn is not None else None
        logprobs = list(getattr(segment, "logprobs", ()))
        reason = "length" if turn is None or turn.finish_reason == "length" else "stop"
        prompt_tokens = ctx.builder.total_tokens - len(ids)
        return {
            "request_id": f"generate-{session.key[:8]}-{session.calls}",
            "model": "policy",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                      "total_tokens": prompt_tokens + len(ids)},
            "choices": [{"index": 0, "finish_reason": reason, "token_ids": ids,
                         "logprobs": {"content": [{"token": f"token_id:{i}", "token_id": i, "logprob": lp}
                                                  for i, lp in zip(ids, logprobs, strict=True)]}}],
        }

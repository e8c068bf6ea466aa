"""The result of one multi-turn episode, and its mapping onto the trainer's `Sample` (torch-free).

The mapping (rlkit.rollout.groups hands these samples to the trainer):

| Sample field     | from the episode                                                                          |
|------------------|-------------------------------------------------------------------------------------------|
| prompt_ids       | the trajectory's prompt                                                                   |
| completion_ids   | every token after the prompt, sampled and inserted, in order                              |
| behav_logp       | the server's log-prob on sampled tokens, 0.0 on inserted ones                             |
| loss_mask        | 1 on sampled tokens, 0 on inserted ones (new optional field; None = all trained)         |
| token_versions   | per token, the weight version it was sampled at; -1 on inserted (new optional field)      |
| version          | the OLDEST version any of its tokens was sampled at: staleness is bounded by the oldest   |
| finished         | not truncated (a truncated episode is handled like DAPO's overlong samples)               |
| reward, group, server | the episode's reward; set by the rollout; the server of the first turn               |

The trainer counts only loss_mask-1 tokens in its losses, token counts, KL, advantages and log-prob checks
(rlkit.trainer.sampled_tokens).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from rlkit.agent.tools import ToolResult
from rlkit.agent.trajectory import SampledSegment, Trajectory
from rlkit.types import Sample


class EpisodeDropped(Exception):
    """An episode that cannot be trained on through no fault of rlkit's (an agent program that raised, hung or made
    no call): its group is dropped and counted, and the run goes on (rlkit.rollout.groups)."""


def cannot_start(exc: OSError) -> bool:
    """A program that is missing or may not be run (not there, a directory on the way not searchable by this user,
    not executable): the same for every episode, so the run stops with it instead of dropping every group for hours
    (a verifiers venv never installed: 5,800 groups dropped in 10 minutes, the job at step 0 until its time limit).
    Other start failures (out of processes or memory) may pass and drop only the episode."""
    return isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError)) or exc.errno == errno.ENOEXEC


@dataclass
class ToolTally:
    """Counts one episode's tool use as it goes (the registry counts per tool over all episodes)."""

    calls: int = 0
    errors: int = 0  # failed calls plus calls that could not be parsed
    seconds: float = 0.0

    def add_results(self, results: list[ToolResult]) -> None:
        self.calls += len(results)
        self.errors += sum(not r.ok for r in results)
        self.seconds += sum(r.seconds for r in results)

    def add_unparsed(self, count: int) -> None:
        """Calls the model wrote but that could not be read: the model is told, and they count as errors."""
        self.calls += count
        self.errors += count


@dataclass
class Episode:
    """A finished episode: its token-exact trajectory, reward and tool use."""

    trajectory: Trajectory
    reward: float
    tools: ToolTally = field(default_factory=ToolTally)
    info: dict[str, float] = field(default_factory=dict)

    @property
    def version(self) -> int:
        """The oldest weight version any token was sampled at (-1 if nothing was sampled)."""
        sampled = [s.version for s in self.trajectory.segments if isinstance(s, SampledSegment)]
        return min(sampled, default=-1)

    def to_sample(self, *, group: int, server: int = -1) -> Sample:
        """The training sample of this episode (see the module's table)."""
        t = self.trajectory
        return Sample(prompt_ids=list(t.prompt_ids), completion_ids=list(t.token_ids),
                      behav_logp=list(t.behav_logp), reward=self.reward, version=self.version,
                      finished=not t.truncated, group=group, info=dict(self.info), server=server,
                      loss_mask=list(t.loss_mask), token_versions=list(t.versions))

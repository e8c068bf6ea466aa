"""When the trainer pushes weights to the servers (actor.weight_update_interval k, actor.weight_update_offset o), and
what the staleness bound means then (Trinity-RFT's synchronizer: sync_interval, sync_offset).

A weight version counts pushes, not steps: after step s the servers hold version pushes_after(s) = max(0, s - o) // k,
so the first o steps train on batches the servers generated ahead with the starting weights, and from then on a push
follows every k-th step. A group sampled at version v may be trained while the trainer is at most
max_head_offpolicyness versions ahead of it; step t trains with the weights of version pushes_after(t - 1), so the
groups started while the servers hold v may feed steps up to o + (v + max_head_offpolicyness + 1) * k (the
admission bound). With k = 1 and o = 0 both are today's: one push per step, version = step.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.actor import ActorConfig


@dataclass(frozen=True)
class SyncSchedule:
    """Push every `interval` steps after the first `offset` steps."""

    interval: int = 1
    offset: int = 0

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"interval must be at least 1, got {self.interval}")
        if self.offset < 0:
            raise ValueError(f"offset must be at least 0, got {self.offset}")

    def pushes_after(self, step: int) -> int:
        """The weight version the servers hold once step `step` is done (0 before any push)."""
        return max(0, step - self.offset) // self.interval

    def pushes_at(self, step: int) -> bool:
        """Whether step `step` ends with a push."""
        return step > self.offset and (step - self.offset) % self.interval == 0

    def last_step_trainable(self, version: int, max_offpolicyness: int) -> int:
        """The last step a group sampled at `version` may feed under the staleness bound."""
        return self.offset + (version + max_offpolicyness + 1) * self.interval

    def admission_batches(self, version: int, max_offpolicyness: int, steps_done: int) -> int:
        """How many batches may have been started since a (re)start at step `steps_done` while the servers hold
        `version`: every batch up to the last step such a group may feed."""
        return self.last_step_trainable(version, max_offpolicyness) - steps_done


def schedule_for(actor: ActorConfig) -> SyncSchedule:
    """The schedule a config asks for (actor.weight_update_interval, actor.weight_update_offset)."""
    return SyncSchedule(actor.weight_update_interval, actor.weight_update_offset)

"""The rlkit mapping `rlkit migrate` writes for a verl run, and the fate of each verl key (rlkit.config.verl.rules)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from rlkit.config.dotted import put
from rlkit.config.problems import Problems


@dataclass(frozen=True)
class VerlKey:
    """One verl key of the run and what became of it (for the migrated file's header)."""

    key: str
    value: Any
    fate: str


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class RunMapping:
    """The rlkit mapping being written and the fate of each verl key."""

    def __init__(self, leaves: dict[str, Any], source: str, overridden: Collection[str]) -> None:
        self.leaves, self.source, self.overridden = leaves, source, overridden
        self.out: dict[str, Any] = {}
        self.fates: list[VerlKey] = []
        self.problems = Problems()
        self.done: set[str] = set()
        self.critic = False  # the run's algorithm trains a critic (verl's GAE)
        self.whose = "verl's"  # whose the written defaults are (Trinity-RFT's embedded verl config has its own)
        self.whole_config = False  # a YAML file: it spells out verl's defaults too (a script's keys are its choices)
        # the reward model's servers' GPUs: (taken from the run's colocated GPUs, on nodes of their own)
        self.reward_gpus = (0, 0)

    def fate(self, key: str, what: str) -> None:
        self.done.add(key)
        self.fates.append(VerlKey(key, self.leaves.get(key, "(unset)"), what))

    def moved(self, key: str, to: str, value: Any, how: str = "") -> None:
        put(self.out, to, value)
        self.fate(key, f"moved to {to}{how}")

    def left(self, key: str, why: str) -> None:
        self.fate(key, f"left out ({why})")

    def refuse(self, key: str, why: str, hint: str, unless: str = "") -> None:
        """A problem naming `key`; or, when the user's override sets `unless` (rlkit's key), left out for it."""
        if unless and unless in self.overridden:
            self.left(key, f"{why}; your {unless} override is used")
            return
        self.done.add(key)
        self.problems.add(f"{key} {self.leaves.get(key)!r} ({self.source}): {why}", hint=hint)

"""Field helpers shared by the schema modules: every field carries a one-line help text, and a number its range.

A range lives beside its field (`_f(1, "...", ge=1)`) so that one check (rlkit.config.ranges) enforces every range
with the same words and a fix that is itself a valid value, instead of each section's check writing its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A seed's range: what every library rlkit hands one to accepts. numpy's legacy seeding (np.random.seed, which vLLM
# and SGLang call with their --seed at start) refuses anything outside it, default_rng any negative one.
SEED_MAX = 2**32 - 1


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ge/gt a lower bound (inclusive/exclusive), le/lt an upper one; None: unbounded."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def holds(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))


def _f(default: Any, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
       lt: float | None = None) -> Any:
    """A field with a default, a one-line help text and, for a number, the range its values must lie in."""
    metadata: dict[str, Any] = {"help": help}
    if (ge, gt, le, lt) != (None, None, None, None):
        metadata["range"] = Range(ge=ge, gt=gt, le=le, lt=lt)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _sub(cls: type, help: str) -> Any:
    """A nested section."""
    return field(default_factory=cls, metadata={"help": help})

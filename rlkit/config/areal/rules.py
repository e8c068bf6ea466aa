"""How one AReaL key that rlkit's schema lacks is judged: the rule kinds of rlkit.config.areal.keys' table.

AReaL users bring configs full of keys rlkit has no field for. None of them is dropped silently: each is either
accepted, because under rlkit it changes nothing, and then named in one notice with the reason, or refused with
exit 2 because it would change training in a way rlkit does not (yet) do. A rule says which, given the key's value
(after `${...}` interpolation) and rlkit's own resolved config.

Four reasons to accept, shown in the notice:
- DERIVED: rlkit computes this value itself (a trial name repeated inside a section); accepted when it agrees.
- INERT: nothing under rlkit on Slurm reads it (data-loader workers, AReaL's own scheduler, tracing switches).
- SAME: it would change training, but the value given is what rlkit does anyway (`ignore_eos: false`).
- RENAMED: AReaL's name of a key rlkit has elsewhere or under AReaL's later name; the value is used as that key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkit.config.schema.experiment import ExperimentConfig

if TYPE_CHECKING:
    from rlkit.config.job_facts import JobFacts

USED = "used"  # read by rlkit (the per-engine layout fields): judged elsewhere, not in the notice
DERIVED = "rlkit derives it"
INERT = "no effect under rlkit on Slurm"
SAME = "same as rlkit's behaviour"
RENAMED = "used under rlkit's name"

Check = Callable[[Any, ExperimentConfig], "bool | None"]  # None: cannot be told here (a site file is missing)
Value = Callable[[ExperimentConfig], Any]


@dataclass(frozen=True)
class Rule:
    """One AReaL key: why it may be accepted (`kind`, `why`), when (`ok`; None: always), and for a refusal what is
    wrong (`refused`) and what to do instead (`fix`). `expected` gives rlkit's own value for the messages. A rule
    with `keys` is an AReaL-only section: its sub-keys are judged one by one by those rules; any other value of the
    section (null) is judged by `ok`. A rule with `for_job` depends on the config's job type: the rule it returns
    for the job type's facts (None: an unknown type) is the one judged."""

    kind: str
    why: str
    ok: Check | None = None
    expected: Value | None = None
    fix: str = ""
    refused: str = ""
    keys: dict[str, Rule] = field(default_factory=dict)
    renamed_to: str = ""
    for_job: Callable[[JobFacts | None], Rule] | None = None

    def judged_for(self, job: JobFacts | None) -> Rule:
        """The rule that judges a key of a config whose job type is `job`."""
        return self.for_job(job) if self.for_job is not None else self

    def accepts(self, value: Any, config: ExperimentConfig) -> bool | None:
        """True or False; None when it depends on a site file that cannot be read here (render warns, submit
        refuses)."""
        if self.ok is None:
            return True
        verdict = self.ok(value, config)
        return None if verdict is None else bool(verdict)


def derived(name: str, value: Value) -> Rule:
    """A repeat of rlkit's own `name` (AReaL writes `${name}`): accepted when equal to it."""
    return Rule(DERIVED, f"from {name}", ok=lambda v, c: v == value(c), expected=value,
                refused=f"disagrees with rlkit's {name}", fix=f"remove it (rlkit takes {name}), or make them agree")


def per_job(make: Callable[[JobFacts | None], Rule]) -> Rule:
    """A rule that depends on the config's job type (`make` builds it from the type's facts, rlkit.config.job_facts;
    its kind and reason are those of an unknown type's)."""
    return dataclasses.replace(make(None), for_job=make)


def used(why: str) -> Rule:
    """A key rlkit reads (a per-engine layout field); its checks are not the table's."""
    return Rule(USED, why)


def renamed(ours: str, why: str) -> Rule:
    """AReaL's name of a key rlkit has as `ours` (a dotted path): the value is used as `ours`."""
    return Rule(RENAMED, f"as {ours}: {why}", renamed_to=ours)


def inert(why: str) -> Rule:
    """Read by nothing under rlkit, whatever its value."""
    return Rule(INERT, why)


def inert_if(why: str, ok: Check, refused: str, fix: str) -> Rule:
    """Inert for the values `ok` accepts (e.g. `false` of a switch rlkit lacks); other values are refused."""
    return Rule(INERT, why, ok=ok, refused=refused, fix=fix)


def same(why: str, ok: Check, fix: str, expected: Value | None = None, refused: str = "") -> Rule:
    """Training-relevant: accepted only for the values that are what rlkit does (`why` says what that is)."""
    return Rule(SAME, why, ok=ok, expected=expected, fix=fix, refused=refused or f"not supported yet ({why})")


def same_value(rlkit_name: str, value: Value, why: str = "") -> Rule:
    """AReaL's key for a setting rlkit has under another name: accepted when it agrees with rlkit's."""
    return Rule(SAME, why or f"rlkit's key is {rlkit_name}", ok=lambda v, c: _equal(v, value(c)), expected=value,
                refused=f"disagrees with rlkit's {rlkit_name}", fix=f"set {rlkit_name} instead (and remove this key)")


def off(what: str, *accepted: Any, fix: str = "") -> Rule:
    """A switch or knob of a feature rlkit does not have: accepted at the listed values (the feature off)."""
    shown = " or ".join(_show(a) for a in accepted)
    return Rule(SAME, f"{what}: off, as in rlkit", ok=lambda v, c: any(_equal(v, a) for a in accepted),
                refused=f"{what} is not supported yet", fix=fix or f"remove it, or set it to {shown}")


def section(why: str, keys: dict[str, Rule]) -> Rule:
    """An AReaL-only section judged key by key; null (the section not set) is accepted."""
    return Rule(INERT, why, ok=lambda v, c: v is None, keys=keys, refused="must be a section of keys, or null",
                fix="give its keys as a mapping, or remove it")


def _equal(a: Any, b: Any) -> bool:
    """Equality as a YAML reader means it: 1 == 1.0, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    return bool(a == b)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def show(value: Any) -> str:
    """A value as the user wrote it in YAML (null, true, 1.0, [a, b])."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return _show(value)

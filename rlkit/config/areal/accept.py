"""AReaL's keys in a config: taken out before the schema merge, judged after it (rlkit.config.areal.keys' rules).

`split_areal_keys` walks the user's mapping along the schema and takes out every key that rlkit's schema lacks but
AReaL has; what is left merges onto the schema as before (a key in neither stays an unknown key, with did-you-mean).
`judge` resolves the taken keys' `${...}` against rlkit's resolved config, so `${experiment_name}` is rlkit's own
value, then either accepts each (an `AcceptedKey`, for the one notice and the trial's manifest) or refuses it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.areal.keys import RENAMED_SECTIONS, TABLES
from rlkit.config.areal.rules import DERIVED, RENAMED, USED, Rule, show
from rlkit.config.problems import Problems, interpolation_fix
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.walk import field_names, section_type
from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.config.job_facts import JobFacts

_SHOWN_VALUE = 40  # characters of a value in the notice
_WHOLE_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")
_MAX_CHAIN = 8  # references followed from one AReaL key to another (a cycle stops here; OmegaConf then reports it)


@dataclass(frozen=True)
class FoundKey:
    """An AReaL-only key of the user's config, as written (`value` may hold `${...}`)."""

    key: str
    value: Any
    rule: Rule
    origin: str


@dataclass(frozen=True)
class AcceptedKey:
    """An AReaL key rlkit accepted without using it: the key, its value and why (`kind`: rlkit.config.areal.rules'
    DERIVED, INERT or SAME; `why`: the detail)."""

    key: str
    value: Any
    kind: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "reason": self.kind, "detail": self.why}

    def line(self) -> str:
        value = show(self.value)
        if len(value) > _SHOWN_VALUE:
            value = value[:_SHOWN_VALUE - 3] + "..."
        return f"{self.key}: {value}  ({self.kind}: {self.why})"


def split_areal_keys(data: dict[str, Any], origin: str, problems: Problems) -> tuple[dict[str, Any], list[FoundKey]]:
    """`data` without its AReaL-only keys, and those keys. A key under an AReaL-only section that AReaL does not
    have either, and an AReaL section rlkit names differently, go to `problems`."""
    data, found = _rename_sections(data, origin, problems)
    kept = _split(data, ExperimentConfig, "", origin, found, problems)
    return kept, found


WHOLE_SECTION = "(the whole section)"  # the value a renamed section is listed with (its keys are judged as rlkit's)


def _rename_sections(data: dict[str, Any], origin: str, problems: Problems
                     ) -> tuple[dict[str, Any], list[FoundKey]]:
    """`data` with each AReaL section rlkit names otherwise (AReaL-lite's `model:`, the trained model) under rlkit's
    name, its `${...}` references following it (a new mapping; `data` is left as it is), and those renames; both
    names given at once is an error naming both."""
    found = []
    for old, ours in RENAMED_SECTIONS.items():
        if not isinstance(data.get(old), dict):
            continue
        if ours in data:
            problems.add(f"'{old}' (AReaL's older name of '{ours}') and '{ours}' are both given ({origin})",
                         hint=f"move the keys of '{old}:' into '{ours}:'")
            continue
        data = _map_strings({ours if k == old else k: v for k, v in data.items()}, _retarget(old, ours))
        found.append(FoundKey(old, WHOLE_SECTION, Rule(RENAMED, f"as {ours}: AReaL's older name of the section",
                                                       renamed_to=ours), origin))
    return data, found


def _retarget(old: str, ours: str) -> Callable[[str], str]:
    """`${old.x}` -> `${ours.x}` (and `${old}` -> `${ours}`) in one string."""
    pattern = re.compile(r"\$\{" + re.escape(old) + r"([.}])")
    return lambda text: pattern.sub(lambda m: "${" + ours + m[1], text)


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        return {k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    return change(value) if isinstance(value, str) else value


def _split(data: dict[str, Any], cls: type, prefix: str, origin: str, found: list[FoundKey],
           problems: Problems) -> dict[str, Any]:
    table = TABLES.get(prefix.rstrip("."), {})
    names = field_names(cls)
    kept: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key in names:
            sub = section_type(cls, key)
            kept[key] = _split(value, sub, f"{path}.", origin, found, problems) \
                if sub is not None and isinstance(value, dict) else value
        elif isinstance(key, str) and key in table:
            _take(path, value, table[key], origin, found, problems)
        elif not prefix and key in RENAMED_SECTIONS:
            pass  # given beside rlkit's name of the section: reported by _rename_sections
        else:
            kept[key] = value  # unknown to AReaL too: the schema merge reports it, with did-you-mean
    return kept


def move_renamed(tree: dict[str, Any], found: list[FoundKey], problems: Problems) -> None:
    """Put the value of each found key that is an AReaL name of an rlkit key (`actor.beta`: dpo.beta;
    `behave_imp_weight_cap`, renamed since) under rlkit's key in `tree`, where the key came from; both given with
    different values is an error."""
    for item in found:
        ours = item.rule.renamed_to
        if not ours or item.value == WHOLE_SECTION:  # a section: renamed in place before the split
            continue
        node: Any = tree
        *parents, leaf = ours.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue  # a section given as a value: reported by the section check
        if leaf in node and node[leaf] != item.value:
            problems.add(f"'{item.key}: {show(item.value)}' and '{ours}: {show(node[leaf])}' ({item.origin}) are one "
                         f"setting (rlkit's name, then AReaL's) with different values", hint=f"keep only {ours}")
            continue
        node[leaf] = item.value


def _take(path: str, value: Any, rule: Rule, origin: str, found: list[FoundKey], problems: Problems) -> None:
    """Record `path`, or each key under it when it is an AReaL-only section given as a mapping."""
    if not (rule.keys and isinstance(value, dict)):
        found.append(FoundKey(path, value, rule, origin))
        return
    for key, sub in value.items():
        rule_of_key = rule.keys.get(str(key))
        if rule_of_key is None:
            close = difflib.get_close_matches(str(key), list(rule.keys), n=1, cutoff=0.6)
            hint = f"did you mean '{path}.{close[0]}'?" if close else f"valid keys here: {', '.join(sorted(rule.keys))}"
            problems.add(f"unknown key '{path}.{key}' ({origin})", hint=hint)
        else:
            _take(f"{path}.{key}", sub, rule_of_key, origin, found, problems)


def inline_areal_references(tree: dict[str, Any], found: list[FoundKey]) -> None:
    """Replace, in place, each value of `tree` that is a whole `${key}` naming one of the `found` (taken out) keys
    by that key's own value: `use_lora: ${rollout.use_lora}` must still mean something once rollout.use_lora, an
    AReaL-only key, is no longer in the mapping the schema resolves."""
    values = {item.key: item.value for item in found}

    def inline(value: Any, depth: int = 0) -> Any:
        if isinstance(value, dict):
            return {k: inline(v, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [inline(v, depth) for v in value]
        match = _WHOLE_REFERENCE.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None or match.group(1) not in values or depth > _MAX_CHAIN:
            return value
        return inline(values[match.group(1)], depth + 1)

    for key, value in tree.items():
        tree[key] = inline(value)


def rule_for(path: str) -> Rule | None:
    """The rule of a dotted AReaL key (`ref.path`, `actor.fsdp.wrap_policy`); None when no table has it."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):  # the longest section path with a table
        table = TABLES.get(".".join(parts[:cut]))
        if table is None:
            continue
        rule = table.get(parts[cut])
        for part in parts[cut + 1:]:
            rule = rule.keys.get(part) if rule is not None else None
        if rule is not None:
            return rule
    return None


def merge_found(*groups: list[FoundKey]) -> list[FoundKey]:
    """The keys of every group, a later group's key replacing an earlier one's (overrides win over the YAML)."""
    by_key: dict[str, FoundKey] = {}
    for group in groups:
        for item in group:
            by_key[item.key] = item
    return list(by_key.values())


def resolved_values(found: list[FoundKey], cfg: DictConfig, problems: Problems) -> dict[str, Any]:
    """Each found key's value with its `${...}` resolved against rlkit's resolved config and the other found keys;
    a key that cannot be resolved goes to `problems` (and is left out)."""
    tree = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    for item in found:
        _put(tree, item.key, item.value)
    values: dict[str, Any] = {}
    try:
        both = OmegaConf.create(tree)
    except (OmegaConfBaseException, ValueError, TypeError) as exc:  # a value OmegaConf cannot hold (say, int keys)
        for item in found:
            problems.add(f"cannot read '{item.key}' ({item.origin}): {str(exc).splitlines()[0]}")
        return values
    for item in found:
        try:
            value = OmegaConf.select(both, item.key, throw_on_resolution_failure=True)
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except OmegaConfBaseException as exc:
            detail = str(exc).splitlines()[0]
            problems.add(f"cannot resolve '{item.key}' ({item.origin}): {detail}", hint=interpolation_fix(detail))
            continue
        values[item.key] = value
    return values


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def judge(found: list[FoundKey], cfg: DictConfig, config: ExperimentConfig, problems: Problems,
          job: JobFacts | None = None) -> list[AcceptedKey]:
    """Accept or refuse each found key (after `${...}`); the refusals go to `problems`, naming key, value and fix.
    `job`: the facts of the config's job type, for the rules that depend on it (None: an unknown type)."""
    values = resolved_values(found, cfg, problems)
    accepted: list[AcceptedKey] = []
    for item in found:
        if item.key not in values or item.rule.kind == USED:
            continue
        rule = item.rule.judged_for(job)
        item = replace(item, rule=rule)
        value = values[item.key]
        try:
            verdict = rule.accepts(value, config)
        except (TypeError, ValueError, AttributeError):  # a value of a type the rule cannot compare: not rlkit's
            verdict = False
        if verdict:
            accepted.append(AcceptedKey(item.key, value, rule.kind, rule.why))
        else:
            problems.errors.append(_refusal(item, value, config, site=verdict is None))
    return accepted


def _refusal(item: FoundKey, value: Any, config: ExperimentConfig, *, site: bool) -> ConfigError:
    rule = item.rule
    ours = ""
    if rule.expected is not None:
        try:
            ours = f" (rlkit: {show(rule.expected(config))})"
        except (AttributeError, TypeError, ValueError):
            ours = ""
    if site:
        return ConfigError(f"AReaL key '{item.key}: {show(value)}' ({item.origin}) cannot be checked here: {rule.why}",
                           hint=rule.fix, site=True)
    what = rule.refused or f"not supported yet ({rule.why})"
    return ConfigError(f"AReaL key '{item.key}: {show(value)}' ({item.origin}): {what}{ours}", hint=rule.fix)


def notice_lines(accepted: list[AcceptedKey] | tuple[AcceptedKey, ...]) -> list[str]:
    """The one notice of a config's accepted AReaL keys: a headline, then one line per key (derived first)."""
    if not accepted:
        return []
    order = {DERIVED: 0}
    keys = sorted(accepted, key=lambda a: (order.get(a.kind, 1), a.kind, a.key))
    return [f"{len(keys)} AReaL key(s) that rlkit has no field for, accepted (recorded in the trial's manifest.json):",
            *(f"  {a.line()}" for a in keys)]

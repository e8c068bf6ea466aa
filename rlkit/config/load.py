"""YAML + dotlist overrides -> a typed ExperimentConfig, with one clear error per mistake."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
import stat
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from rlkit.config.areal.accept import (
    AcceptedKey,
    FoundKey,
    inline_areal_references,
    judge,
    merge_found,
    move_renamed,
    split_areal_keys,
)
from rlkit.config.areal.layout import apply_layout
from rlkit.config.areal.older_norm import SWITCHES_BECOME_SECTIONS, translate_older_norm
from rlkit.config.areal.rules import DERIVED
from rlkit.config.container_values import check_container
from rlkit.config.job_facts import JobTypeLookup
from rlkit.config.problems import Problems, interpolation_fix
from rlkit.config.schema.auxiliary import check_entries
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.walk import schema_paths, section_type
from rlkit.config.yaml_text import MAX_DEPTH, load_yaml, nesting
from rlkit.errors import ConfigError


def _did_you_mean(full_key: str) -> str:
    """Suggest the closest valid key for an unknown dotted key."""
    paths = schema_paths()
    leaf = full_key.rsplit(".", 1)[-1]
    same_leaf = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return f"did you mean '{same_leaf[0]}'?"
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    siblings = [p for p in paths if p.rsplit(".", 1)[0] == parent and "." in p] if parent else [
        p for p in paths if "." not in p
    ]
    names = [s.rsplit(".", 1)[-1] for s in siblings]
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{parent + '.' if parent else ''}{close[0]}'?"
    return f"valid keys here: {', '.join(sorted(names))}"


def _explain(exc: OmegaConfBaseException, origin: str) -> ConfigError:
    """Turn an OmegaConf error into one user-facing message naming the field."""
    key = str(getattr(exc, "full_key", "") or "")
    if isinstance(exc, ConfigKeyError):
        return ConfigError(f"unknown key '{key}' ({origin})", hint=_did_you_mean(key))
    if isinstance(exc, ValidationError):
        detail = str(exc).splitlines()[0]
        return ConfigError(f"wrong type for '{key}' ({origin}): {detail}",
                           hint=f"`rlkit explain {key.split('[')[0]}` shows its type and default")
    if isinstance(exc, MissingMandatoryValue):
        return ConfigError(f"required field '{key}' is not set ({origin})",
                           hint=f"add it to the YAML or pass {key}=...")
    if isinstance(exc, InterpolationResolutionError):
        detail = str(exc).splitlines()[0]
        return ConfigError(f"cannot resolve '{key}' ({origin}): {detail}", hint=interpolation_fix(detail))
    return ConfigError(f"invalid configuration at '{key}' ({origin}): {str(exc).splitlines()[0]}")


CONFIG_FILE_LIMIT = 16 * 2**20  # bytes: an experiment file is a few KB


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping from a file, or raise ConfigError saying what is wrong with it."""
    try:
        info = path.stat()  # once: a missing file is FileNotFoundError below
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block forever, /dev/zero read without end
            raise ConfigError(f"config file '{path}' is not a regular file", hint="give the path of an experiment "
                              "YAML file")
        if info.st_size > CONFIG_FILE_LIMIT:
            raise ConfigError(f"config file '{path}' is larger than {CONFIG_FILE_LIMIT // 2**20} MiB",
                              hint="give the path of an experiment YAML file")
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist", hint="give the path of an experiment YAML file") \
            from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' cannot be read as text: {getattr(exc, 'strerror', None) or exc}",
                          hint="give the path of an experiment YAML file you may read") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"'{path}' is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = {"list": "a list", "str": "a string", "int": "a number", "float": "a number", "bool": "true or false",
                "datetime": "a date", "date": "a date", "bytes": "binary data"}.get(type(data).__name__, "one value")
        raise ConfigError(f"'{path}' must hold a mapping of keys to values, not {kind}",
                          hint="write it as `key: value` lines, e.g. experiment_name: my-exp (see configs/)")
    return data


_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # how Python's argv holds the bytes it could not decode


def parse_overrides(overrides: list[str]) -> DictConfig:
    """Dotlist overrides (`a.b=1`) as a DictConfig, values read as in the YAML file; malformed ones: ConfigError."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, _, text = item.partition("=")
        parts = key.split(".")
        if "=" not in item or not all(parts):
            raise ConfigError(f"override '{item}' is not of the form key.path=value", hint="e.g. cluster.n_nodes=4")
        if _NOT_UTF8.search(item):  # bytes Python could not decode (a Latin-1 terminal): no quoting makes them text
            raise ConfigError(f"override {item!r} holds bytes that are not UTF-8 text",
                              hint="type it in a UTF-8 terminal (LANG=C.UTF-8) or write the value in the YAML file")
        if len(parts) > MAX_DEPTH:
            raise ConfigError(f"override key '{key[:100]}...' is {len(parts)} levels deep (an rlkit key has a few)",
                              hint="e.g. cluster.n_nodes=4")
        try:
            value = load_yaml(text) if text else ""
            if len(parts) + (nesting(value) or 0) > MAX_DEPTH:
                raise yaml.YAMLError(f"its key and value are nested more than {MAX_DEPTH} levels deep")
        except yaml.YAMLError as exc:
            shown = item if len(item) <= 120 else f"{item[:100]}... ({len(item)} characters)"
            raise ConfigError(f"override '{shown}': the value is not valid YAML ({getattr(exc, 'problem', exc)})",
                              hint="quote it: key='value with: colons'") from None
        node = tree
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    try:
        return OmegaConf.create(tree)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot parse overrides {overrides}: {str(exc).splitlines()[0]}") from None


_WHOLE_REFERENCE = re.compile(r"\$\{[A-Za-z_][\w.]*\}")


def _check_sections(data: Any, cls: type, prefix: str, origin: str, problems: Problems) -> None:
    """A schema section must receive a mapping (OmegaConf's own error would not name the field). A value given for
    a section goes to `problems` and is dropped from `data`, so that the rest of the file is still judged: every
    problem in one list."""
    if not isinstance(data, dict):
        return
    for f in dataclasses.fields(cls):
        section = section_type(cls, f.name)
        if section is None and f.name in data:
            check_container(data, cls, f.name, prefix, origin, problems)
        if section is None or f.name not in data:
            continue
        value = data[f.name]
        if value is None and f.default is None:  # an optional section switched off
            continue
        if isinstance(value, str) and _WHOLE_REFERENCE.fullmatch(value.strip()):
            continue  # `optimizer: ${actor.optimizer}` (AReaL's critic): the section it names, once resolved
        if isinstance(value, bool) and f"{prefix}{f.name}" in SWITCHES_BECOME_SECTIONS:
            continue  # AReaL's older `adv_norm: true`: rlkit.config.areal.older_norm turns it into the section
        if not isinstance(value, dict):
            example = dataclasses.fields(section)[0].name
            problems.add(f"'{prefix}{f.name}' is a section, not a value ({origin})",
                         hint=f"set its fields, e.g. {prefix}{f.name}.{example}=...")
            del data[f.name]
            continue
        _check_sections(value, section, f"{prefix}{f.name}.", origin, problems)


def _drop(data: dict[str, Any], full_key: str) -> bool:
    """Remove the entry at a dotted key (a list index drops the whole list); False when it is not there."""
    parts = [part.split("[", 1)[0] for part in full_key.split(".")]
    node: Any = data
    for part in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return False
        node = node[part]
    if not isinstance(node, dict) or parts[-1] not in node:
        return False
    del node[parts[-1]]
    return True


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, mapping by mapping (an override `actor.path=...` keeps the file's other actor keys)."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        merged[key] = _deep_merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


def _escaped_references(value: Any, key: str = "") -> list[str]:
    """The keys whose resolved value still holds `${`: an escaped reference, the only way one survives resolution."""
    if isinstance(value, dict):
        return [k for name, v in value.items() for k in _escaped_references(v, f"{key}.{name}" if key else str(name))]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in _escaped_references(v, f"{key}[{i}]")]
    return [key] if isinstance(value, str) and "${" in value else []


def _default_group_size(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """actor.group_size given nowhere: `${gconfig.n_samples}`, the only value validation accepts (a group is the
    completions of one prompt), and what AReaL's current configs, which no longer have the key, mean."""
    actor, over = data.get("actor"), overrides.get("actor")
    if any(isinstance(s, dict) and "group_size" in s for s in (actor, over)) or (actor is not None and \
            not isinstance(actor, dict)):
        return
    data["actor"] = {**(actor or {}), "group_size": "${gconfig.n_samples}"}


def _settle_type(data: dict[str, Any], merged: dict[str, Any], problems: Problems,
                 accepted: list[AcceptedKey] | None, job_types: JobTypeLookup) -> None:
    """A user's file without `type`: set it when the training rows leave one choice (named in the notice), refuse it
    unless the config is obviously a generate job (the job types' guess, rlkit.jobs.type_guess)."""
    verdict = job_types.guess_type(merged)
    if isinstance(verdict, ConfigError):
        problems.errors.append(verdict)
    elif verdict is not None:
        data["type"] = verdict
        if accepted is not None:
            accepted.append(AcceptedKey("type", verdict, DERIVED, f"the one job type of train_dataset.type "
                                                                  f"'{verdict}' (set type to be explicit)"))


@functools.cache
def _schema() -> DictConfig:
    """The schema as an OmegaConf tree, built once per process (merging copies it, never changes it)."""
    return OmegaConf.structured(ExperimentConfig)


def _merge_all(cfg: DictConfig, data: dict[str, Any], origin: str, problems: Problems) -> DictConfig:
    """Merge `data` onto `cfg`. A key OmegaConf refuses (unknown, wrong type) is reported and left out, and the
    merge is tried again, so every such key is reported at once."""
    data = copy.deepcopy(data)
    while True:
        try:
            merged = OmegaConf.merge(cfg, OmegaConf.create(data))
        except OmegaConfBaseException as exc:
            problems.errors.append(_explain(exc, origin))
            if not _drop(data, str(getattr(exc, "full_key", "") or "")):
                return cfg
            continue
        assert isinstance(merged, DictConfig)
        return merged


def areal_to_rlkit(data: dict[str, Any], override_tree: dict[str, Any], *, source: str, problems: Problems,
                   accepted: list[AcceptedKey] | None = None, require_type: JobTypeLookup | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any], list[FoundKey]]:
    """The file's mapping and the overrides as rlkit's schema reads them, and the AReaL keys taken out of them (to be
    judged once resolved): AReaL names of rlkit keys moved to those keys, the per-engine layout fields turned into
    allocation_mode, references to taken-out keys inlined, `type` settled by the job types `require_type` when
    given. `rlkit migrate` prints the result; `compose` merges it."""
    raw = _deep_merge(data, override_tree)  # what the user wrote, for ${...} in the layout fields
    data, override_tree = copy.deepcopy(data), copy.deepcopy(override_tree)
    older, in_overrides = translate_older_norm(data, override_tree, f"in {source}", problems)
    data, found = split_areal_keys(data, f"in {source}", problems)
    override_tree, found_in_overrides = split_areal_keys(override_tree, "in a command-line override", problems)
    (found_in_overrides if in_overrides else found).extend(older)
    move_renamed(data, found, problems)
    move_renamed(override_tree, found_in_overrides, problems)
    found = merge_found(found, found_in_overrides)
    apply_layout(found, data, override_tree, raw, problems)
    _default_group_size(data, override_tree)
    inline_areal_references(data, found)
    inline_areal_references(override_tree, found)
    if require_type is not None:
        _settle_type(data, _deep_merge(data, override_tree), problems, accepted, require_type)
    return data, override_tree, found


def compose(data: dict[str, Any], overrides: list[str], *, source: str, problems: Problems,
            accepted: list[AcceptedKey] | None = None, job_types: JobTypeLookup | None = None,
            require_type: bool = False) -> DictConfig | None:
    """Merge a YAML mapping and overrides onto the schema and resolve interpolations; every problem goes to
    `problems`. None when no typed config can be built (a required field missing, a reference unresolvable).
    AReaL's keys that rlkit lacks are judged (rlkit.config.areal.accept): refusals go to `problems`, the keys
    accepted without being used to `accepted`; those whose rule depends on the job type with its facts from
    `job_types` (rlkit.jobs.REGISTRY; None is enough for a trial's own config.yaml, which holds no AReaL keys, and a
    ValueError when such a key turns up without them). `require_type`: a user's file must set `type` unless the job
    types find it (obviously a generate job, or one type its rows allow; programmatic mappings keep the schema's
    default)."""
    if require_type and job_types is None:
        raise ValueError("require_type needs the job types that settle a missing type")
    cfg = _schema()
    override_tree: dict[str, Any] = {}
    with problems.check():
        override_tree = cast(dict[str, Any], OmegaConf.to_container(parse_overrides(overrides)))
    if not problems.ok():
        return None  # an unreadable override: nothing sensible to merge
    data = copy.deepcopy(data)  # the caller's mapping stays as it was
    _check_sections(data, ExperimentConfig, "", f"in {source}", problems)
    _check_sections(override_tree, ExperimentConfig, "", "in a command-line override", problems)
    data, override_tree, found = areal_to_rlkit(data, override_tree, source=source, problems=problems,
                                                accepted=accepted, require_type=job_types if require_type else None)
    check_entries(data, f"in {source}", problems)  # a list of sections: checked before OmegaConf sees it
    check_entries(override_tree, "in a command-line override", problems)
    cfg = _merge_all(cfg, data, f"in {source}", problems)
    if override_tree:
        cfg = _merge_all(cfg, override_tree, "in a command-line override", problems)
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as exc:  # a ${...} naming no key: reported as the resolution below would
        problems.errors.append(_explain(exc, "while resolving ${...} references"))
        return None
    for key in missing:
        problems.add(f"required field '{key}' is not set", hint=f"add it to {source} or pass {key}=... on the "
                                                                "command line")
    if missing:
        return None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        problems.errors.append(_explain(exc, "while resolving ${...} references"))
        return None
    escaped = _escaped_references(OmegaConf.to_container(cfg, resolve=False))
    for key in escaped:  # `\${x}` resolves to the text `${x}`, which the next reader would take for a reference
        problems.add(f"{key} holds an escaped reference (\\${{...}}): rlkit resolves a config once, and the trial's "
                     "recorded config would read it as a reference", hint=f"write {key}'s value in full, without ${{")
    if escaped:
        return None
    if found:
        if job_types is None and any(item.rule.for_job is not None for item in found):
            raise ValueError("AReaL keys whose rule depends on the job type need the job types (rlkit.jobs.REGISTRY)")
        config = cast(ExperimentConfig, OmegaConf.to_object(cfg))
        job = job_types.facts_of(config.type) if job_types is not None else None
        keys = judge(found, cfg, config, problems, job)
        if accepted is not None:
            accepted.extend(keys)
    return cfg


def load_config_collecting(path: str | Path, overrides: list[str], problems: Problems, job_types: JobTypeLookup,
                           accepted: list[AcceptedKey] | None = None) -> ExperimentConfig | None:
    """Load a user's experiment YAML with overrides, adding every schema problem to `problems` (and AReaL's keys
    accepted without use to `accepted`); None when no typed config could be built. `job_types` (rlkit.jobs.REGISTRY)
    settle a missing `type` and judge AReaL's keys that depend on it. A missing or unparsable file is raised at once
    (there is nothing else to check)."""
    path = Path(path)
    return typed_config(compose(read_yaml(path), list(overrides), source=str(path), problems=problems,
                                accepted=accepted, job_types=job_types, require_type=True))


def typed_config(cfg: DictConfig | None) -> ExperimentConfig | None:
    if cfg is None:
        return None
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, ExperimentConfig)
    return obj


def config_from_mapping(data: dict[str, Any], overrides: list[str] | None = None, *, source: str = "a mapping",
                        job_types: JobTypeLookup | None = None) -> ExperimentConfig:
    """A typed config from a mapping (as if read from YAML) and overrides; raises ConfigErrors naming every
    schema problem. `job_types`: as for `compose`."""
    problems = Problems()
    config = typed_config(compose(data, list(overrides or []), source=source, problems=problems,
                                  job_types=job_types))
    problems.raise_if_any()
    assert config is not None
    return config


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load an experiment YAML with overrides into a typed, resolved ExperimentConfig (no semantic checks);
    raises ConfigErrors naming every schema problem."""
    return config_from_mapping(read_yaml(Path(path)), overrides, source=str(path))


def to_yaml(config: ExperimentConfig) -> str:
    """The resolved config as YAML (what the trial directory records and in-job steps read)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


"""Trinity-RFT's multi-stage runs (`stages:`, e.g. an SFT warm-up then RFT) as rlkit's `stages:`, for `rlkit migrate`
(rlkit.config.trinity).

Trinity-RFT runs its stages in order; a stage may set mode, algorithm, buffer, explorer, trainer and data_processor
(StageConfig), never the model or the cluster; each section it sets replaces the global one whole, each it leaves
out is the global one (its guide: "if not specified, it will inherit from the global `algorithm`"; Config.__iter__
sets the stage's section objects); from the second stage on, the model is the last stage's latest checkpoint
(trinity/cli/launcher.py). rlkit's stages (rlkit.launch.stages)
do the same: one trial per stage, each stage's keys over the top level, a policy stage's final checkpoint handed to
the next as actor.path unless that stage names its own. So each Trinity-RFT stage is migrated as a whole file of its
own (its mode and algorithm_type give its job type), and the rlkit file keeps at its top level only what names the
run and its start (experiment_name, trial_name, cluster.fileroot, actor.path): each stage carries the rest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from rlkit.errors import ConfigError, ConfigErrors, each_error

STAGES = "stages"
STAGE_KEYS = ("stage_name", "mode", "algorithm", "buffer", "explorer", "trainer", "data_processor")  # StageConfig
# rlkit keys only the top level of a staged file sets: they name the run, its directory and its first model
_TOP = (("experiment_name",), ("trial_name",), ("cluster", "fileroot"), ("actor", "path"))

Fate = tuple[str, Any, str]  # (Trinity-RFT key, value, what became of it)
Convert = Callable[[dict[str, Any], str], tuple[dict[str, Any], list[Fate]]]


def has_stages(data: dict[str, Any]) -> bool:
    """Whether a Trinity-RFT file runs stages (a non-empty `stages` list; an empty one is left out as empty)."""
    return data.get(STAGES) not in (None, [], {})


def _stage_file(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """A stage as Trinity-RFT runs it: each section the stage sets replaces the global one whole (Config.__iter__
    sets the stage's AlgorithmConfig, BufferConfig...: what the stage leaves out of a section it sets is that
    section's default, not the global value); the sections it does not set are the global ones."""
    return copy.deepcopy({**base, **{key: value for key, value in own.items() if value is not None}})  # None: unset


def _entries(stages: Any, source: str) -> list[tuple[str, dict[str, Any]]]:
    """(stage_name, the stage's own keys) in order; every malformed stage refused at once."""
    if not isinstance(stages, list):
        raise ConfigError(f"stages ({source}) is a {type(stages).__name__}, not a list of stages",
                          hint="stages: [{stage_name: sft_warmup, mode: train, ...}, {stage_name: rft}]")
    errors: list[ConfigError] = []
    entries: list[tuple[str, dict[str, Any]]] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict) or not isinstance(stage.get("stage_name"), str) or not stage["stage_name"]:
            errors.append(ConfigError(f"stages[{i}] ({source}) is not a mapping with its stage_name",
                                      hint="name every stage: stage_name: sft_warmup"))
            continue
        name = stage["stage_name"]
        unknown = sorted(str(k) for k in stage if k not in STAGE_KEYS)
        if unknown:
            errors.append(ConfigError(f"stage {name} ({source}) sets {', '.join(unknown)}: a Trinity-RFT stage sets "
                                      f"only {', '.join(STAGE_KEYS[1:])}", hint="move them to the top of the file"))
        if any(name == seen for seen, _ in entries):
            errors.append(ConfigError(f"two stages ({source}) are named {name}", hint="name each stage once"))
        entries.append((name, {k: v for k, v in stage.items() if k != "stage_name"}))
    if errors:
        raise ConfigErrors(errors) if len(errors) > 1 else errors[0]
    return entries


def _pop(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    *parents, last = path
    for part in parents:
        tree = tree.get(part, {})
        if not isinstance(tree, dict):
            return None
    return tree.pop(last, None)


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    *parents, last = path
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def stages_to_rlkit(data: dict[str, Any], source: str, convert: Convert) -> tuple[dict[str, Any], list[Fate]]:
    """The rlkit staged mapping of a Trinity-RFT file with stages and every stage's key fates (named by stage);
    ConfigErrors naming every problem of every stage. `convert`: one Trinity-RFT file's mapping and fates
    (rlkit.config.trinity.trinity_to_rlkit with the job types)."""
    entries = _entries(data[STAGES], source)
    base = {k: v for k, v in data.items() if k != STAGES}
    errors: list[ConfigError] = []
    stages: list[dict[str, Any]] = []
    fates: list[Fate] = []
    top: dict[str, Any] = {}
    for i, (name, own) in enumerate(entries):
        try:
            mapping, stage_fates = convert(_stage_file(base, own), f"{source}, stage {name}")
        except ConfigError as exc:
            errors.extend(each_error(exc))  # type: ignore[arg-type]
            continue
        for path in _TOP:
            value = _pop(mapping, path)
            if i == 0 and value is not None:  # global in Trinity-RFT: every stage has the same
                _put(top, path, value)
        if isinstance(mapping.get("actor"), dict) and not mapping["actor"]:
            mapping.pop("actor")
        stages.append({"stage_name": name, **mapping})
        fates.extend((f"[stage {i + 1} {name}] {key}", value, fate) for key, value, fate in stage_fates)
    if errors:
        raise ConfigErrors(errors) if len(errors) > 1 else errors[0]
    return {**top, STAGES: stages}, fates

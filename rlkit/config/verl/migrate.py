"""The file `rlkit migrate` reads for a verl run (a run script of verl.trainer.main_ppo, or a verl YAML config), and
the header naming each of its verl keys and what became of it; any other file goes on to the Trinity-RFT and AReaL
reading (rlkit.config.trinity.as_rlkit_file), untouched."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from rlkit.config.areal.rules import show
from rlkit.config.load import read_yaml
from rlkit.config.trinity import as_rlkit_file as other_file
from rlkit.config.trinity import written
from rlkit.config.verl.data import data_notes
from rlkit.config.verl.rules import VerlKey, verl_to_rlkit
from rlkit.config.verl.source import VerlRun, is_verl_yaml, read_script, read_yaml_run, script_text, unread_error
from rlkit.config.verl.variables import Expansion
from rlkit.errors import ConfigError, ConfigErrors, each_error

_SHOWN_VALUE = 60
_WIDTH = 118  # a note's lines


def _overridden(overrides: list[str]) -> dict[str, str]:
    """The rlkit keys the command line's overrides set, with their values (rlkit.config.verl.reward_model reads
    whether reward.fn / reward.fns name the reward model)."""
    return {word.split("=", 1)[0].lstrip("+"): word.split("=", 1)[1] for word in overrides if "=" in word}


@contextmanager
def as_rlkit_file(path: Path, algorithms: Mapping[str, str], overrides: list[str],
                  estimators: Mapping[str, str]) -> Iterator[tuple[Path, str]]:
    """As rlkit.config.trinity.as_rlkit_file, verl's runs first: a script naming verl.trainer.main_ppo, or a YAML
    file of verl's sections, becomes its rlkit mapping in a temporary file and the header of its verl keys.
    `estimators`: verl's adv_estimator -> rlkit's job type (rlkit.jobs.REGISTRY.verl_estimators)."""
    source = f"in {path}"
    text = script_text(path)
    if text is not None:
        run = read_script(text, source)
    elif path.suffix in (".sh", ".bash"):
        raise ConfigError(f"'{path}' runs no verl.trainer.main_ppo command",
                          hint="give rlkit migrate the script that runs python3 -m verl.trainer.main_ppo, or a "
                               "verl, Trinity-RFT or AReaL YAML file")
    elif is_verl_yaml(read_yaml(path)):
        run = read_yaml_run(path, source)
    else:
        with other_file(path, algorithms) as converted:
            yield converted
        return
    overridden = _overridden(overrides)
    unread = unread_error(run, source)
    try:
        mapping, fates = verl_to_rlkit(run.leaves, source, estimators, overridden, whole_config=text is None)
    except ConfigError as exc:
        if unread is None:
            raise
        raise ConfigErrors([unread, *(e for e in each_error(exc) if isinstance(e, ConfigError))]) from None
    if unread is not None:
        raise unread
    with written(path, mapping, header(path, fates, run, data_notes(run.leaves, overridden))) as converted:
        yield converted


def _expansion(made: Expansion) -> str:
    """`$name = value (line N)`, saying where a default was taken what would win over it in verl."""
    value = show(made.value.text)
    value = value if len(value) <= _SHOWN_VALUE else value[:_SHOWN_VALUE - 3] + "..."
    name = made.name if made.name.startswith("$") else f"${made.name}"
    said = [f"${{{d}:-...}}'s default: " + (f"an argument {d} given to the script" if d.isdigit() else
                                           f"{d} set in verl's environment") + " would win"
            for d in made.value.defaults]
    return f"{name} = {value} (line {made.value.line}{''.join('; ' + s for s in said)})"


def header(path: Path, fates: list[VerlKey], run: VerlRun, notes: Sequence[str] = ()) -> str:
    """The header lines: each verl key of the run and what became of it, the shell variables to be given values,
    the words of the command that were not read, and `notes` (paragraphs: the run's data and reward)."""
    lines = [f"# verl run {path.name} read by `rlkit migrate`; its keys and what became of each:"]
    for item in sorted(fates, key=lambda f: f.key):
        value = show(item.value)
        value = value if len(value) <= _SHOWN_VALUE else value[:_SHOWN_VALUE - 3] + "..."
        lines.append(f"#   {item.key}: {value}  -> {item.fate}")
    if run.expanded:
        lines.append("# Shell variables the script sets, expanded in the command as bash would (the script is read, "
                     "never run):")
        lines += [f"#   {_expansion(made)}" for made in run.expanded]
    if run.variables:
        lines.append("# Shell variables left as written: replace each with its value (rlkit does not expand them):")
        for key, names in sorted(run.variables.items()):
            for name in names:
                where = f" (the script sets {name}={run.assigned[name]})" if name in run.assigned else ""
                lines.append(f"#   ${name} in {key}{where}")
    if run.ignored:
        lines.append(f"# Words of the command that are not key=value, not read: {' '.join(run.ignored)}")
    for note in notes:
        lines += textwrap.wrap(note.replace("\n", " "), _WIDTH, initial_indent="# ", subsequent_indent="#   ")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"

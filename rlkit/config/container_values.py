"""A schema field's raw value against its container type, before OmegaConf's merge sees it.

OmegaConf's merge raised a bare TypeError, naming no field, for a list given where a mapping is typed or the
reverse, let a list or mapping in as an item of a list of strings, and turns a number into its string silently:
each is a problem naming the key (the value is dropped so that the rest of the file is still judged).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.schema.walk import container_kind

_EXAMPLE = {"mapping": "{key: value}", "list": "[a, b]"}
# Lists of strings whose items must be written as text: OmegaConf turns a number or a boolean into its string, and a
# stop list of [1] would end every completion at the first "1" it prints (a token id belongs nowhere in it).
# Elsewhere the conversion is what the user meant (a program's argv: [prog.py, --n, 4]).
_TEXT_ITEMS = frozenset({"stop"})


def _check_text_items(data: dict[str, Any], name: str, prefix: str, origin: str, problems: Problems) -> None:
    """Refuse (and drop) a number or a boolean among the items of `data[name]`, naming the first."""
    found = next(((i, v) for i, v in enumerate(data[name]) if isinstance(v, (bool, int, float))), None)
    if found is None:
        return
    index, item = found
    problems.add(f"wrong type for '{prefix}{name}[{index}]' ({origin}): a stop string is text, not the "
                 f"{type(item).__name__} {item!r} (a token id cannot be given here; the model's EOS ends a "
                 "completion)", hint=f"quote it if the text is meant, e.g. {prefix}{name}=['{_yaml_word(item)}']")
    del data[name]


def check_container(data: dict[str, Any], cls: type, name: str, prefix: str, origin: str,
                     problems: Problems) -> None:
    """A field typed as a mapping given a list, or as a list given a mapping, or a list of strings holding a list or
    a mapping, or a stop list holding a number or a boolean: reported and dropped (OmegaConf's merge raised a bare
    TypeError for the first two, naming no field, let the third through to the checks and made the fourth text)."""
    kind, value = container_kind(cls, name), data[name]
    given = "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else None
    if kind == given == "list":  # of strings (a list of sections is no "list"): OmegaConf let [[1]] or [{a: 1}] in
        inner = next(((i, v) for i, v in enumerate(value) if isinstance(v, (dict, list))), None)
        if inner is not None:
            problems.add(f"wrong type for '{prefix}{name}[{inner[0]}]' ({origin}): a string is expected, not a "
                         f"{'mapping' if isinstance(inner[1], dict) else 'list'} ({inner[1]!r})",
                         hint=f"give {prefix}{name} as a list of strings, e.g. {prefix}{name}=[a, b]")
            del data[name]
        elif name in _TEXT_ITEMS:
            _check_text_items(data, name, prefix, origin, problems)
        return
    if kind is None or given is None or kind == given:
        return
    problems.add(f"wrong type for '{prefix}{name}' ({origin}): a {kind} is expected, not a {given}",
                 hint=f"write it as {prefix}{name}={_EXAMPLE[kind]}")
    del data[name]


def _yaml_word(item: bool | int | float) -> str:
    """The item as the user wrote it in YAML (true, not Python's True)."""
    return str(item).lower() if isinstance(item, bool) else str(item)

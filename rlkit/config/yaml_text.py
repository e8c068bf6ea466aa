"""YAML without the YAML 1.1 traps: a value that is not plainly a number or true/false stays the text the user wrote.

PyYAML follows YAML 1.1, where `1:30:00` is the base-60 number 5400, `007` and `0o17` are octal, `1_000` is 1000,
`0x1F` is 31 and `on`/`yes`/`no` are booleans. A Slurm time, a trial name of digits or a partition called `on` would
silently become something else. Here only the plain decimal forms become numbers (`42`, `-3`, `0.5`, `1.5e-3`, `.inf`)
and only `true`/`false` become booleans; everything else is kept as written, and the typed schema converts it where
the field wants a number (`"007"` for an int field is 7; for a string field it stays `007`). Command-line overrides
are read with the same rules.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
_PLAIN_BOOL = {"true": True, "false": False}
MAX_DEPTH = 64  # nesting levels of a config value: rlkit's deepest section is a few; a file deeper is not a config


class TextFaithfulLoader(yaml.SafeLoader):
    """SafeLoader that turns only plain decimal numbers and true/false into non-strings."""


def _int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = str(loader.construct_scalar(node))
    return int(text) if _PLAIN_INT.fullmatch(text) else text


def _float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = str(loader.construct_scalar(node))
    return loader.construct_yaml_float(node) if _PLAIN_FLOAT.fullmatch(text) else text


def _bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = str(loader.construct_scalar(node))
    return _PLAIN_BOOL.get(text.lower(), text)


TextFaithfulLoader.add_constructor("tag:yaml.org,2002:int", _int)
TextFaithfulLoader.add_constructor("tag:yaml.org,2002:float", _float)
TextFaithfulLoader.add_constructor("tag:yaml.org,2002:bool", _bool)


def load_yaml(text: str) -> Any:
    """Parse YAML text with the rules above (raises yaml.YAMLError on a syntax error, and on nesting deeper than
    MAX_DEPTH: PyYAML's parser, OmegaConf and the schema checks all recurse, and "[[[[..." a few thousand deep
    would end in a RecursionError traceback instead of a message)."""
    try:
        data = yaml.load(text, Loader=TextFaithfulLoader)  # a SafeLoader: no arbitrary objects
    except RecursionError:
        raise yaml.YAMLError(f"it is nested deeper than Python's parser follows (a config is at most {MAX_DEPTH} "
                             "levels deep)") from None
    if _depth(data) > MAX_DEPTH:
        raise yaml.YAMLError(f"it is nested more than {MAX_DEPTH} levels deep (an rlkit config has a few)")
    return data


def _depth(data: Any) -> int:
    """How many mappings and lists deep `data` goes (walked without recursion; a YAML alias counts where it is used,
    and a value reached again through an alias is not walked twice)."""
    deepest, todo, seen = 0, [(data, 1)], set()
    while todo:
        node, depth = todo.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        todo.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest

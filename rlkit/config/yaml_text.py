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
MAX_DEPTH = 32  # nesting levels of a config: rlkit's deepest section is a few; OmegaConf's merge recursion
# fails near 80


class TextFaithfulLoader(yaml.SafeLoader):
    """SafeLoader that turns only plain decimal numbers and true/false into non-strings, and refuses a key written
    twice in one mapping (PyYAML keeps the last silently: a second `actor:` section would drop the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:  # as written: keys a `<<: *base` merge brings in may be overridden
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if key_node.value in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key '{key_node.value}' is written twice in one mapping (first at line "
                    f"{first[key_node.value].line + 1}); only the last would count", key_node.start_mark)
            first[key_node.value] = key_node.start_mark
        return super().construct_mapping(node, deep)


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
    depth = nesting(data)
    if depth is None:
        raise yaml.YAMLError("a value refers to itself through an alias (&name ... *name inside itself)")
    if depth > MAX_DEPTH:
        raise yaml.YAMLError(f"it is nested more than {MAX_DEPTH} levels deep (an rlkit config has a few)")
    return data


def nesting(data: Any) -> int | None:
    """How many mappings and lists deep `data` goes, counting no deeper than MAX_DEPTH + 1 (a value shared through
    YAML aliases is measured once); None when a value contains itself (`a: &a [*a]`), which every later walk of the
    config would follow forever."""
    heights: dict[int, int] = {}
    open_ids: set[int] = set()

    def height(node: Any, level: int) -> int:
        if not isinstance(node, (dict, list)):
            return 0
        if id(node) in open_ids:
            raise _Cycle
        if level > MAX_DEPTH:
            return 1
        if id(node) not in heights:
            open_ids.add(id(node))
            children = node.values() if isinstance(node, dict) else node
            heights[id(node)] = 1 + max((height(child, level + 1) for child in children), default=0)
            open_ids.discard(id(node))
        return heights[id(node)]

    try:
        return height(data, 1)
    except _Cycle:
        return None


class _Cycle(Exception):
    """A value reached again inside itself."""

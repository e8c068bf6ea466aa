"""One rule for every string of a configuration, checked centrally before any field-specific check.

Strings reach the sbatch script (as `#SBATCH` lines, comments and shell-quoted arguments), argv lists inside the
job, and file names. A newline ends a `#SBATCH` line and starts a command, and sbatch stops reading options at the
first command; other control characters garble logs and terminals. So no string field may hold one, wherever it
goes. Slurm's own names (partition, account, ...) must also look like Slurm names, so that they need no quoting
in `#SBATCH` lines at all.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import get_field

# Characters of Slurm names, per option: names, comma lists, hostlists, and feature expressions.
_NAME = r"[A-Za-z0-9_.-]+"
SLURM_VALUE_PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "launcher.slurm.partition": (re.compile(rf"{_NAME}(,{_NAME})*"), "partition names (letters, digits, _ . -), "
                                 "comma-separated"),
    "launcher.slurm.account": (re.compile(_NAME), "an account name (letters, digits, _ . -)"),
    "launcher.slurm.qos": (re.compile(_NAME), "a QOS name (letters, digits, _ . -)"),
    "launcher.slurm.constraint": (re.compile(r"[A-Za-z0-9_.,&|*()\[\]:-]+"),
                                  "feature names with Slurm's operators & | , * [ ] ( ) :"),
    "launcher.slurm.nodelist": (re.compile(r"[A-Za-z0-9_.,\[\]-]+"), "a hostlist such as gpu[01-04],gpu07"),
    "launcher.slurm.exclude": (re.compile(r"[A-Za-z0-9_.,\[\]-]+"), "a hostlist such as gpu[01-04],gpu07"),
}
# Strings that only ever travel inside JSON request bodies (and config.yaml, YAML-escaped), never into the script,
# an argv or a file name: a stop string is often exactly a newline.
_ONLY_IN_REQUESTS = ("gconfig.stop[", "eval_gconfig.stop[")
_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+%-]+")


def string_fields(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, value) of every string in a config: dataclass fields, dict keys and values, list items."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            yield from string_fields(getattr(node, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(key, str):
                yield f"{path} (the key)", key
            yield from string_fields(value, path)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from string_fields(value, f"{prefix}[{i}]")
    elif isinstance(node, str):
        yield prefix, node


def control_characters(value: str) -> list[str]:
    """The control and line-separator characters in `value`, as escapes (e.g. ['\\n'])."""
    bad = {ch for ch in value if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch not in "\u200d"}
    return sorted(repr(ch)[1:-1] for ch in bad)


def check_strings(config: Any, problems: Problems) -> None:
    """Every string field: no control characters, no unexpanded `~`, Slurm names shaped like Slurm names."""
    garbled: set[str] = set()
    for path, value in string_fields(config):
        if path.startswith(_ONLY_IN_REQUESTS):
            continue
        bad = control_characters(value)
        if bad:
            garbled.add(path)
            problems.add(f"{path} holds control characters ({', '.join(bad)}): {value!r}",
                         hint="remove them; a newline or tab in a YAML value usually comes from a multi-line "
                              "string or a paste (use a plain one-line value)")
            continue
        if value == "~" or value.startswith("~/"):
            problems.add(f"{path} '{value}' starts with '~', which rlkit does not expand (steps run as other "
                         "processes on other nodes)", hint=f"write the absolute path, e.g. {path}=/home/me/...")
    for path, (pattern, what) in SLURM_VALUE_PATTERNS.items():
        value = str(get_field(config, path))
        if value and path not in garbled and not pattern.fullmatch(value):
            problems.add(f"{path} {value!r} is not {what}",
                         hint="check the value with sinfo/sacctmgr; other sbatch options go in "
                              "launcher.slurm.sbatch_additional_args")


def sbatch_quote(token: str) -> str:
    """One argument as sbatch reads it from a `#SBATCH` line: plain, or in double quotes with \\ and \" escaped
    (sbatch's own rules, read back from Slurm 22.05 by tests/integration/test_weird_values.py; inside double quotes a
    single quote or `#` is an ordinary character). Control characters are refused earlier."""
    if _SBATCH_PLAIN.fullmatch(token):
        return token
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'

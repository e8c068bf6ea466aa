"""One shellcheck input for many rendered scripts: the template with every rendered variant of each of its lines.

shellcheck 0.9's cost is its analysis, linear in the lines it reads (~1.5 ms of CPU a line here): checking the 27
golden scripts one by one read the same ~340 template lines 27 times (18 CPU-s). Each rendered script is the
template (rlkit/launch/supervisor.sh) with its @PLACEHOLDER@ lines filled in and blocks of generated functions
inserted, so the union below (every template line, and beside it every distinct rendered text that replaces or
follows it in any script) holds every rendered line in the place it has in its own script: one run (~3 CPU-s)
analyses each distinct line once, and each finding is traced back to the scripts and lines it came from.
A cross-line finding (a variable assigned but never used, or used but never assigned) sees the other scripts'
lines too; the template itself and the repository's scripts are still checked whole, on their own.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Union:
    lines: list[str]
    origins: list[list[str]]  # per line: "NAME:LINE" of each script (or "template:LINE") the line stands for

    @property
    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)

    def explain(self, shellcheck_gcc_output: str, union_path: str) -> str:
        """shellcheck's `--format=gcc` findings, each on a union line followed by the scripts and lines it is."""
        explained = []
        for finding in shellcheck_gcc_output.splitlines():
            match = re.match(rf"{re.escape(union_path)}:(\d+):", finding)
            where = f"  <- {', '.join(self.origins[int(match[1]) - 1])}" if match else ""
            explained.append(finding + where)
        return "\n".join(explained)


def union_of(template: str, scripts: dict[str, str]) -> Union:
    """The template's lines in order; before each, every distinct chunk of rendered lines some script has in its
    place (difflib's replace/insert against the template), once. Shebangs are kept only as the first line."""
    base = template.splitlines()
    chunks: dict[int, dict[tuple[str, ...], list[tuple[str, int]]]] = {}  # template line -> text -> (name, line)
    for name, script in scripts.items():
        rendered = script.splitlines()
        for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(None, base, rendered, autojunk=False).get_opcodes():
            if tag in ("replace", "insert"):
                kept = [(j, rendered[j]) for j in range(j1, j2) if not (j == 0 and rendered[j].startswith("#!"))]
                if kept:
                    at = chunks.setdefault(i1, {}).setdefault(tuple(text for _, text in kept), [])
                    at.append((name, kept[0][0] + 1))
    lines, origins = ["#!/bin/bash"], [["every script's shebang"]]
    for index in range(len(base) + 1):
        for chunk, where in chunks.get(index, {}).items():
            lines += chunk
            origins += [[f"{name}:{first + offset}" for name, first in where] for offset in range(len(chunk))]
        if index < len(base) and not (index == 0 and base[0].startswith("#!")):
            lines.append(base[index])
            origins.append([f"template:{index + 1}"])
    return Union(lines, origins)

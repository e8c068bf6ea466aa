"""Which paths the code tool's run covers, worked out in the rollout process before the run: the caller's hide list
made absolute, with link targets, and around what the run needs. Why: a hidden directory that holds the
interpreter or the scratch root cannot be covered whole, and leaving it visible (as a note said before) left the
trial's secrets beside them readable while the run reported isolated=True; a dataset reached through a link (a
Hugging Face cache's snapshots/<rev>/file -> ../../blobs/<hash>) hidden at the link only left the blob readable."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

MAX_LINKS = 10_000  # entries of a dataset directory searched for links out of it
HF_LAYOUT = ("snapshots", ("datasets--", "models--", "spaces--"))  # <cache>/<kind>--<name>/snapshots/<rev>/...


class CannotHide(Exception):
    """A path that must be hidden cannot be (a directory on the way that cannot be listed)."""


def hidden_paths(hide: Sequence[str], keep: Sequence[str], skipped: list[str] | None = None) -> tuple[str, ...]:
    """The paths to cover for `hide`: each one whole, or, when it holds a path of `keep`, each of its entries that
    does not (recursively down to the kept ones). Relative paths are made absolute; symlinks inside a hidden
    directory are not followed (their targets are reached and hidden by their own paths). A path that cannot be
    hidden raises CannotHide, or with `skipped` (best_effort) is left visible and said there."""
    kept = [os.path.normpath(os.path.abspath(path)) for path in keep]
    covered: list[str] = []
    for path in dict.fromkeys(os.path.normpath(os.path.abspath(p)) for p in hide if p):
        inside = [k for k in kept if k == path or k.startswith(path.rstrip("/") + "/")]
        try:
            if path in inside or path == "/":
                raise CannotHide(f"{path} is what the run needs (the interpreter's prefix or the scratch root)")
            covered.extend(_around(path, inside) if inside else [path])
        except CannotHide as exc:
            if skipped is None:
                raise
            skipped.append(f"{exc}: it stays visible")
    return tuple(dict.fromkeys(covered))


def _around(directory: str, keep: list[str]) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise CannotHide(f"{directory} holds what the run needs ({', '.join(keep)}) and cannot be listed to hide "
                         f"the rest: {exc.strerror}") from exc
    covered = []
    for name in names:
        child = os.path.join(directory, name)
        inside = [k for k in keep if k == child or k.startswith(child + "/")]
        if not inside:
            if not os.path.islink(child):
                covered.append(child)
        elif child not in inside:
            covered.extend(_around(child, inside))
    return covered


def needed_by_run(interpreter: str, scratch: Path) -> list[str]:
    """What a run must see: the interpreter's prefix (the directory above its bin/, as given and resolved: a venv
    and the Python it links to) and the directory of every run's scratch directory."""
    prefixes = [os.path.dirname(os.path.dirname(os.path.abspath(interpreter))),
                os.path.dirname(os.path.dirname(os.path.realpath(interpreter)))]
    return [*dict.fromkeys(prefixes), str(scratch.parent)]


def dataset_paths(path: str) -> list[str]:
    """What to hide for a dataset at `path` (a file or a directory, absolute or relative to the working
    directory): its directory (the directory holding a file), the same after resolving links, the whole
    <kind>--<name> repository of a Hugging Face cache (its blobs are the files), and the directories that links
    inside a dataset directory point to."""
    if not path:
        return []
    absolute = os.path.abspath(os.path.expanduser(path))
    found = []
    for candidate in dict.fromkeys((absolute, os.path.realpath(absolute))):
        found.append(candidate if os.path.isdir(candidate) or not os.path.exists(candidate)
                     else os.path.dirname(candidate))
        found.extend(_hf_repository(candidate))
    if os.path.isdir(absolute):
        found.extend(_link_targets(absolute))
    return [*dict.fromkeys(found)]


def _hf_repository(path: str) -> list[str]:
    parts = Path(path).parts
    for index in range(1, len(parts)):
        if parts[index] == HF_LAYOUT[0] and parts[index - 1].startswith(HF_LAYOUT[1]):
            return [str(Path(*parts[:index]))]
    return []


def _link_targets(directory: str) -> list[str]:
    """The directories of the targets of links under `directory` that lead out of it (the first MAX_LINKS
    entries; a Hugging Face snapshot's files all lead to its blobs)."""
    targets: list[str] = []
    seen = 0
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            seen += 1
            full = os.path.join(root, name)
            if os.path.islink(full):
                real = os.path.realpath(full)
                if not real.startswith(directory.rstrip("/") + "/"):
                    targets.append(real if os.path.isdir(real) else os.path.dirname(real))
                    targets.extend(_hf_repository(real))
            if seen >= MAX_LINKS:
                return [*dict.fromkeys(targets)]
    return [*dict.fromkeys(targets)]

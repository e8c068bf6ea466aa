"""Which rlkit this is, by its content. The version string names a release line, not the code: a checkout after
`git pull`, an image built a month ago and a login venv installed last week all say 0.1.0. A login node that
validated a config with one rlkit and nodes that run another is a job whose steps may read the config differently
(a key one knows and the other does not, a changed default), found only when something goes wrong in the job.

The id is a hash of the package's own files (its .py modules and the data files it ships: the supervisor script,
the images' pins), by their paths inside the package: the same for a checkout, an editable install, a wheel in a
login venv (scripts/install.sh) and an image's copy of the same code. Only what a wheel carries counts (setuptools
packs the modules of its packages and the declared package data): a stray file in a checkout (notes.txt, a
Jupyter checkpoint) would otherwise fail a job whose image was pip-installed from that very checkout.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SHIPPED_DATA = ("launch/supervisor.sh", "images/pins.txt")  # pyproject's package-data (a test holds them equal)
LENGTH = 16  # hex characters: 64 bits, plenty to tell versions of one package apart, short enough to read


def source_id(package: Path = PACKAGE) -> str:
    """The content hash of the rlkit package at `package` (this one by default); computed once per process."""
    return _source_id(package.resolve())


@cache
def _source_id(package: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*") if _shipped(p.relative_to(package).parts) and p.is_file())
    for path in files:
        data = path.read_bytes()
        name = path.relative_to(package).as_posix().encode()
        digest.update(b"%d:%s%d:" % (len(name), name, len(data)))  # lengths first: no two file sets hash alike
        digest.update(data)
    return digest.hexdigest()[:LENGTH]


def _shipped(parts: tuple[str, ...]) -> bool:
    """Whether a wheel carries the file at `parts` inside the package: a module (not hidden: build_py globs *.py) of
    a package (no dot in a directory's name: __pycache__ has none but is no package either), or declared data."""
    *dirs, name = parts
    if name.endswith(".py"):
        return not name.startswith(".") and "__pycache__" not in dirs and not any("." in d for d in dirs)
    return "/".join(parts) in SHIPPED_DATA


def describe() -> str:
    """`rlkit 0.1.0 (source 3f2a..., /path/to/rlkit)`: what `rlkit --version` prints and a job's node check names."""
    from rlkit import __version__

    return f"rlkit {__version__} (source {source_id()}, {PACKAGE})"

"""Which rlkit this is, by its content. The version string names a release line, not the code: a checkout after
`git pull`, an image built a month ago and a login venv installed last week all say 0.1.0. A login node that
validated a config with one rlkit and nodes that run another is a job whose steps may read the config differently
(a key one knows and the other does not, a changed default), found only when something goes wrong in the job.

The id is a hash of the package's own files (its .py modules and the data files it ships: the supervisor script,
the images' pins), by their paths inside the package: the same for a checkout, an editable install, a wheel in a
login venv (scripts/install.sh) and an image's copy of the same code. Bytecode and caches are left out.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SUFFIXES = (".py", ".sh", ".txt")
LENGTH = 16  # hex characters: 64 bits, plenty to tell versions of one package apart, short enough to read


def source_id(package: Path = PACKAGE) -> str:
    """The content hash of the rlkit package at `package` (this one by default); computed once per process."""
    return _source_id(package.resolve())


@cache
def _source_id(package: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*") if p.suffix in SUFFIXES and p.is_file()
                   and "__pycache__" not in p.relative_to(package).parts)
    for path in files:
        data = path.read_bytes()
        name = path.relative_to(package).as_posix().encode()
        digest.update(b"%d:%s%d:" % (len(name), name, len(data)))  # lengths first: no two file sets hash alike
        digest.update(data)
    return digest.hexdigest()[:LENGTH]


def describe() -> str:
    """`rlkit 0.1.0 (source 3f2a..., /path/to/rlkit)`: what `rlkit --version` prints and a job's node check names."""
    from rlkit import __version__

    return f"rlkit {__version__} (source {source_id()}, {PACKAGE})"

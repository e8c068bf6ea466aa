"""The dev environment against its lock (scripts/locks/*.txt, written by scripts/lock.sh): every locked distribution
installed at exactly its locked version. `python scripts/lockcheck.py LOCK` prints each difference and exits 1 when
there is one; `--diff` only prints them (the nox session `newest` shows what a fresh resolve would change)."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

ABSENT = "# absent:"  # a lock's line naming distributions that must not be installed (dev.txt: torchvision, ...)


def normalize(name: str) -> str:
    """PEP 503's form of a distribution name (Foo_Bar.baz -> foo-bar-baz)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{normalized name: version} of a lock's `name==version` lines; comments and blank lines skipped, anything else
    (a range, a URL, an editable) refused: a lock pins exact versions only."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"{path}:{number}: {raw!r} is not NAME==VERSION")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def read_absent(path: Path) -> list[str]:
    """The distributions a lock's `# absent: a b c` lines say the environment must not hold."""
    return [normalize(name) for line in path.read_text().splitlines() if line.startswith(ABSENT)
            for name in line[len(ABSENT):].split()]


def installed() -> dict[str, str]:
    """{normalized name: version} of what pip installed into this interpreter's environment: its site-packages
    only, not all of sys.path (setuptools puts its vendored packaging 24.2, platformdirs and typing-extensions there
    once imported, and a test process that had imported it read those as installed)."""
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {normalize(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=site)
            if d.metadata["Name"]}


def differences(lock: dict[str, str], have: dict[str, str], absent: Sequence[str] = ()) -> list[str]:
    """One line per locked distribution missing or at another version, and per absent one installed."""
    lines = [f"{name}: locked {version}, installed {have.get(name, 'nothing')}"
             for name, version in sorted(lock.items()) if have.get(name) != version]
    lines += [f"{name}: installed {have[name]}, which the lock says must be absent" for name in absent if name in have]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument("--diff", action="store_true", help="print the differences and exit 0")
    args = parser.parse_args(argv)
    found = differences(read_lock(args.lock), installed(), read_absent(args.lock))
    for line in found:
        print(line)
    if found and not args.diff:
        print(f"{len(found)} difference(s) from {args.lock}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

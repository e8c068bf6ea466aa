"""rlkit.source_id: a hash of the package's own files, so the same code has the same id wherever it is installed and
any change of a module or shipped data file gives another (the version string, 0.1.0, names neither)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from rlkit.source_id import PACKAGE, source_id


def _copy(where: Path) -> Path:
    copy = where / "rlkit"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_copy_of_the_package_has_its_id_whatever_else_lies_beside_the_code(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    (copy / "__pycache__").mkdir(exist_ok=True)
    (copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")  # bytecode is not the code
    (copy / "notes.md").write_text("a user's stray file\n")  # nor a file the package does not ship
    assert source_id(copy) == source_id() and len(source_id()) == 16


CHANGES: dict[str, Callable[[Path], object]] = {
    "a module's byte": lambda c: (c / "errors.py").write_bytes((c / "errors.py").read_bytes() + b"\n"),
    "the supervisor script": lambda c: (c / "launch" / "supervisor.sh").write_text("#!/bin/bash\n"),
    "a module renamed": lambda c: (c / "errors.py").rename(c / "errors2.py"),
    "the pins removed": lambda c: (c / "images" / "pins.txt").unlink(),
    "a module added": lambda c: (c / "extra.py").write_text(""),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_of_the_code_or_its_data_gives_another_id(tmp_path: Path, change: str) -> None:
    copy = _copy(tmp_path)
    CHANGES[change](copy)
    assert source_id(copy) != source_id()


def test_files_a_wheel_leaves_out_do_not_count(tmp_path: Path) -> None:
    """A submit from a checkout (an editable install) is held to an image or a login venv that pip installed from a
    wheel of the same checkout: files lying in the checkout's package that no wheel carries (setuptools packs the
    modules of its packages and the declared package data only) must not make the ids differ and fail step 0."""
    copy = _copy(tmp_path)
    (copy / "notes.txt").write_text("a user's notes\n")  # not package data
    (copy / "launch" / "mine.sh").write_text("#!/bin/bash\n")  # nor this
    (copy / ".ipynb_checkpoints").mkdir()
    (copy / ".ipynb_checkpoints" / "errors-checkpoint.py").write_text("x = 1\n")  # Jupyter's copy: no package
    (copy / ".#errors.py").write_text("")  # a hidden file: build_py's glob skips it
    assert source_id(copy) == source_id()


def test_the_data_files_hashed_are_the_package_data_pyproject_declares() -> None:
    import tomllib

    from rlkit.source_id import SHIPPED_DATA

    declared = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert sorted(SHIPPED_DATA) == sorted(f"{package.removeprefix('rlkit').lstrip('.').replace('.', '/')}/{name}"
                                          for package, names in declared.items() for name in names)

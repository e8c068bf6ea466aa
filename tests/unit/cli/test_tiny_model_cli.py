"""`rlkit tiny-model` with a path it cannot build into or a seed torch refuses: exit 2 with the fix, no traceback,
and no directory left behind (a fuzzing pass found FileExistsError, FileNotFoundError and torch's ValueError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_rlkit


@pytest.mark.parametrize(("args", "says"), [
    (["/dev/null"], "'/dev/null' is not a directory to write into"),
    (["/proc/rlkit-no-such-dir"], "cannot write '/proc/rlkit-no-such-dir'"),
    (["{tmp}/model", "--seed", "99999999999999999999999"], "--seed 99999999999999999999999 is out of range"),
])
def test_a_path_or_seed_it_cannot_use_is_refused(args: list[str], says: str, tmp_path: Path) -> None:
    result = run_rlkit("tiny-model", *(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert says in result.stderr and "fix:" in result.stderr
    assert not (tmp_path / "model").exists(), "a refused build leaves no directory"


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_directory_is_refused_not_read_as_the_current_one(empty: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """typer reads '' as Path('.'): `rlkit tiny-model ''` built the model into the current directory."""
    monkeypatch.chdir(tmp_path)
    result = run_rlkit("tiny-model", empty)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"tiny-model: the directory {empty!r} is empty" in result.stderr and "fix:" in result.stderr
    assert list(tmp_path.iterdir()) == []

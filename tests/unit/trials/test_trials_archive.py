"""`submit --force` moves the previous run aside (rlkit.trials.records.archive_run) and puts it back if sbatch fails."""

from __future__ import annotations

from pathlib import Path

from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import archive_run, restore_run


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(root: Path, tag: str) -> None:
    for name in ("recover/step-00000004", "checkpoints/step4", "logs/attempt-1", "weights/version-3", "secret"):
        (root / name).mkdir(parents=True, exist_ok=True)
    for name in ("recover/step-00000004/MANIFEST.json", "checkpoints/step4/model.safetensors", "logs/grpo.log",
                 "logs/attempt-1/grpo.log", "metrics.jsonl", "progress.json", "config.yaml", "manifest.json"):
        (root / name).write_text(tag)
    (root / "secret" / "token").write_text("secret")


def test_archive_moves_every_output_of_the_previous_run_but_the_token(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path / "trial")
    _run(paths.root, "run 1")
    before = _tree(paths.root)
    first = archive_run(paths)
    assert first == paths.root / "attempt-1"
    assert sorted(p.name for p in paths.root.iterdir()) == ["attempt-1", "secret"]
    assert _tree(first) == {k: v for k, v in before.items() if not k.startswith("secret/")}
    assert first.stat().st_mode & 0o777 == 0o700
    _run(paths.root, "run 2")  # a second --force: the next number, the first archive untouched
    second = archive_run(paths)
    assert second == paths.root / "attempt-2"
    assert (second / "metrics.jsonl").read_text() == "run 2" and (first / "metrics.jsonl").read_text() == "run 1"
    assert archive_run(paths) is None  # nothing left to move
    assert archive_run(TrialPaths(tmp_path / "never-submitted")) is None


def test_restore_puts_the_previous_run_back_over_what_the_failed_submit_wrote(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path / "trial")
    _run(paths.root, "run 1")
    before = _tree(paths.root)
    archived = archive_run(paths)
    assert archived is not None
    paths.logs.mkdir()
    paths.config.write_text("new config")  # what prepare_trial_dir wrote before sbatch failed
    restore_run(paths, archived)
    assert _tree(paths.root) == before
    assert not archived.exists()

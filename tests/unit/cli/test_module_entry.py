"""`python -m rlkit` from a directory that holds a folder named rlkit (a default fileroot /tmp/rlkit, a checkout
~/rlkit seen from ~): Python looks in the current directory first. Under an editable install (the dev venv, CI) that
folder became the package, a namespace one, and the CLI died in an ImportError traceback; it now says what happened
and exits 2. Installed as a regular package in site-packages the folder never wins (the command then refuses the
missing config, exit 2): either is fine, a traceback is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_folder_named_rlkit_in_the_current_directory_is_named_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "rlkit").mkdir()
    (tmp_path / "rlkit" / "some-trial").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a user's shell: the install alone finds rlkit
    # render imports the package's own attributes (its version), which a namespace package lacks
    done = subprocess.run([sys.executable, "-m", "rlkit", "render", str(tmp_path / "none.yaml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    if "found the folder" in done.stderr:
        assert f"found the folder {tmp_path / 'rlkit'} in the current directory" in done.stderr
        assert "fix: run the `rlkit` command" in done.stderr
    else:
        assert "error: config file" in done.stderr  # the rlkit package, as it should be

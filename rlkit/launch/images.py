"""`rlkit image build` and `rlkit image check`: build a role's Apptainer image from containers/ROLE.def (here, or in
a Slurm job on a compute node, since login nodes often forbid heavy builds), and hold a built image to the pins.

The build on the cluster is a single-function Slurm job, which is what submitit is for (the RL job itself is
heterogeneous, which submitit cannot express). Its folder must be on a filesystem the compute node shares, so it
sits beside the output image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import rlkit
from rlkit.errors import StepError, UserError
from rlkit.images.pins import ROLES, Pins, label_problems, load_pins, rlkit_labels_in
from rlkit.images.sif import SifError, read_sif
from rlkit.launch.single_jobs import QUEUE_WAIT_MIN, submit_function, wait_for_job

INSTALL_HINT = ("install Apptainer (https://apptainer.org/docs/admin/main/installation.html), or build on a compute "
                "node that has it: rlkit image build ROLE --on-cluster --partition NAME")


def repo_root(repo: str | Path | None) -> Path:
    """The checkout whose containers/ holds the definitions: `--repo`, else the one this rlkit was installed from.
    `--repo ''` is refused by name: as a Path it would be the current directory, used silently inside a checkout."""
    if isinstance(repo, str) and not repo:
        raise UserError("--repo is empty: it names no checkout (an empty path is not taken as the current directory)",
                        hint="pass --repo PATH_TO_THE_RLKIT_CHECKOUT, or leave --repo out to build from the checkout "
                             "this rlkit runs from")
    root = Path(repo) if repo is not None else Path(rlkit.__file__).resolve().parents[1]
    if not (root / "containers").is_dir() or not (root / "pyproject.toml").is_file():
        raise UserError(f"{root} is not an rlkit checkout (no containers/ and pyproject.toml there)",
                        hint="pass --repo PATH_TO_THE_RLKIT_CHECKOUT (building copies its rlkit/ into the image)")
    return root


def build_argv(role: str, out: Path, *, force: bool) -> list[str]:
    """`apptainer build [--force] OUT containers/ROLE.def`, run from the checkout (the defs' %files are relative)."""
    return ["apptainer", "build", *(["--force"] if force else []), str(out), f"containers/{role}.def"]


def plan_build(role: str, out: Path | None, repo: str | Path | None, *, force: bool) -> tuple[Path, Path, list[str]]:
    """Check the request before anything runs; (checkout, output path, argv). Every mistake raises UserError."""
    if role not in ROLES:
        raise UserError(f"unknown image role {role!r}", hint=f"one of: {', '.join(ROLES)}")
    root = repo_root(repo)
    if not (root / "containers" / f"{role}.def").is_file():
        raise UserError(f"{root}/containers/{role}.def is missing", hint="restore it from the rlkit repository")
    target = (out if out is not None else Path(f"rlkit-{role}.sif")).expanduser().absolute()
    if target.is_dir():  # `--out ''` is the current directory; --force would have apptainer build over it
        raise UserError(f"--out {target} is a directory, not an image file",
                        hint=f"name the image file, e.g. --out {target / f'rlkit-{role}.sif'}")
    if target.exists() and not force:
        raise UserError(f"{target} exists", hint="pass --force to replace it, or --out ANOTHER_PATH")
    if not target.parent.is_dir() or not os.access(target.parent, os.W_OK):
        raise UserError(f"cannot write {target}: {target.parent} is not a writable directory",
                        hint="pass --out PATH in a directory you can write")
    return root, target, build_argv(role, target, force=force)


NODE_HINT = "pick a partition whose nodes have Apptainer (--partition NAME), or ask the site to install it there"


def run_build(argv: list[str], cwd: str) -> str:
    """The build job's body on the compute node (submitit runs it there)."""
    if shutil.which(argv[0]) is None:
        raise RuntimeError(f"{argv[0]} is not installed on node {socket.gethostname()}: {NODE_HINT}")
    done = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise RuntimeError(f"{' '.join(argv)} failed on {socket.gethostname()} (exit {done.returncode}):\n{tail}")
    return argv[-2]


def build_here(argv: list[str], root: Path) -> None:
    """Build on this machine, apptainer's output streaming through; exit 2 when apptainer is missing."""
    if shutil.which("apptainer") is None:
        raise UserError("apptainer is not installed on this machine (not on PATH)", hint=INSTALL_HINT)
    rc = subprocess.call(argv, cwd=root)
    if rc != 0:
        raise StepError(f"apptainer build failed (exit {rc}); its output is above")


def build_on_cluster(argv: list[str], root: Path, *, partition: str | None, time_min: int, cpus: int,
                     say: Callable[[str], None], wait_min: float | None = None) -> str:
    """Submit the build as a one-task Slurm job through submitit and wait for it, at most `wait_min` minutes (default:
    its time limit and QUEUE_WAIT_MIN in the queue); the Slurm job id."""
    _check_partition(partition, time_min)
    folder = Path(argv[-2]).parent / ".rlkit-image-builds"
    params: dict[str, object] = {"timeout_min": time_min, "cpus_per_task": cpus, "nodes": 1, "tasks_per_node": 1,
                                 "name": f"rlkit-image-{Path(argv[-1]).stem}"}
    job = submit_function(folder, params, partition, run_build, argv, str(root), what="the image build job")
    wait_min = time_min + QUEUE_WAIT_MIN if wait_min is None else wait_min
    say(f"image build submitted as Slurm job {job.job_id}; waiting up to {wait_min:g} minutes (submitit logs in "
        f"{folder})")
    wait_for_job(job, wait_min * 60, "the image build job", folder)
    try:
        job.result()
    except Exception as exc:  # submitit wraps the node's exception with the job's traceback: keep its last line
        raise StepError(f"image build job {job.job_id} failed: {_node_reason(str(exc).strip().splitlines())}") \
            from None
    return str(job.job_id)


def _check_partition(name: str | None, time_min: int) -> None:
    """The partition exists (the default one when unnamed) and allows the build's time limit; exit 2 otherwise."""
    from rlkit.launch.preflight import read_partition
    from rlkit.slurm.time_limits import format_slurm_time

    partition, names = read_partition(name or "")
    if partition is None and names:
        what = f"partition {name!r} does not exist" if name else "the cluster has no default partition"
        raise UserError(what, hint=f"--partition one of: {', '.join(names)}")
    if partition is not None and partition.max_time_s is not None and time_min * 60 > partition.max_time_s:
        raise UserError(f"--time {time_min} exceeds partition {partition.name}'s limit of "
                        f"{format_slurm_time(partition.max_time_s)}", hint=f"--time {partition.max_time_s // 60}")


def _node_reason(lines: list[str]) -> str:
    """The RuntimeError raised on the node, from submitit's report of the failed job (its last exception line)."""
    for line in reversed(lines):
        if "RuntimeError:" in line:
            return line.split("RuntimeError:", 1)[1].strip()
    return lines[-1] if lines else "no reason reported"


@dataclass
class ImageReport:
    """What `rlkit image check` found: the image's labels, and every way it differs from what rlkit needs."""

    path: Path
    labels: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    sha256: str | None = None


def check_image(path: Path, *, pins: Pins | None = None, digest: bool = False) -> ImageReport:
    """Exists, readable, a SIF with a filesystem, labels naming a role, every pinned version as rlkit needs it."""
    report = ImageReport(path)
    if not path.is_file():
        report.problems.append("no such file" if not path.exists() else "not a regular file")
        return report
    if not os.access(path, os.R_OK):
        report.problems.append("not readable by you (the steps run as you): chmod a+r it or ask its owner")
        return report
    try:
        image = read_sif(path)
    except (SifError, OSError) as exc:
        report.problems.append(str(exc))
        return report
    if not image.has_partition:
        report.problems.append("the SIF holds no filesystem partition: the build did not finish")
    if image.deffile is None:
        report.problems.append("no definition file embedded, so no rlkit labels: build it with `rlkit image build`")
        return report
    report.labels = rlkit_labels_in(image.deffile)
    report.problems += label_problems(report.labels, pins or load_pins(), rlkit.__version__)
    if digest:
        report.sha256 = sha256_of(path)
    return report


def sha256_of(path: Path) -> str:
    """The image's sha256, read in 8 MiB blocks (images are GBs)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()

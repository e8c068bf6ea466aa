"""`rlkit image build ROLE` and `rlkit image check PATH` (rlkit.launch.images does the work)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from rlkit.cli.console import TITLE, console, literal
from rlkit.errors import UserError

image_app = typer.Typer(no_args_is_help=True, help="Build rlkit's Apptainer images and check built ones.")
_out = console()


def _say(text: str) -> None:
    """A line of paths, labels and build output, printed as written (no rich markup read in it)."""
    _out.print(text, markup=False)


@image_app.command("build")
def build(role: str = typer.Argument(..., help="trainer, vllm or sglang (containers/ROLE.def)."),
          out: Path = typer.Option(None, "--out", help="Image to write (default: ./rlkit-ROLE.sif)."),
          force: bool = typer.Option(False, "--force", help="Replace an existing image at --out."),
          repo: str = typer.Option(None, "--repo", metavar="<path>",  # text: typer makes '' the Path '.'
                                   help="The rlkit checkout (default: the one rlkit runs from)."),
          on_cluster: bool = typer.Option(False, "--on-cluster", help="Build in a Slurm job on a compute node "
                                          "(login nodes often forbid heavy builds); --out must be on a shared "
                                          "filesystem."),
          partition: str = typer.Option(None, "--partition", help="Partition of the build job (--on-cluster)."),
          time_min: int = typer.Option(120, "--time", help="Time limit of the build job in minutes (--on-cluster)."),
          cpus: int = typer.Option(8, "--cpus", help="CPUs of the build job (--on-cluster)."),
          wait_min: int = typer.Option(None, "--wait", help="Minutes to wait for the build job, its time in the "
                                       "queue included (--on-cluster; default --time + 120); the job keeps "
                                       "running past it.")) -> None:
    """Build a role's image from containers/ROLE.def with the pinned versions; its %test fails a broken build."""
    from rlkit.launch.images import build_here, build_on_cluster, plan_build

    small = [f"--{name} {value}" for name, value in (("time", time_min), ("cpus", cpus), ("wait", wait_min))
             if value is not None and value < 1]
    if small:
        raise UserError(f"{', '.join(small)}: must be at least 1", hint="e.g. --time 120 --cpus 8 --wait 240")
    root, target, argv = plan_build(role, out, repo, force=force)
    if on_cluster:
        job_id = build_on_cluster(argv, root, partition=partition, time_min=time_min, cpus=cpus, say=_say,
                                  wait_min=wait_min)
        _say(f"image built in Slurm job {job_id}: {target}")
    else:
        build_here(argv, root)
        _say(f"image built: {target}")
    _say(f"check it with:  rlkit image check {target}")


@image_app.command("check")
def check(path: Path = typer.Argument(..., help="A built image (.sif)."),
          sha256: bool = typer.Option(False, "--sha256", help="Also compute its sha256 (reads all of it).")) -> None:
    """Exists, readable, a SIF, and labelled with the versions this rlkit needs (exit 2 naming each difference)."""
    from rlkit.launch.images import check_image

    report = check_image(path.expanduser(), digest=sha256)
    table = Table("label", "value", title=literal(path, TITLE))
    for key, value in sorted(report.labels.items()):
        table.add_row(literal(key), literal(value))
    if report.labels:
        _out.print(table)
    if report.sha256:
        _say(f"sha256 {report.sha256}")
        _record_sha256(path.expanduser(), report.sha256)
    if report.problems:
        raise UserError(f"image {path} is not usable by this rlkit:\n  " + "\n  ".join(report.problems),
                        hint="rebuild it with `rlkit image build ROLE` from this checkout")
    _say(f"image {path}: usable ({report.labels.get('org.rlkit.role')})")


def _record_sha256(image: Path, digest: str) -> None:
    """Leave the digest beside the image (sha256sum's format) for the manifests of later submits; skipped quietly
    where the directory is not the user's to write."""
    from rlkit.images.sif import sha256_record

    try:
        sha256_record(image).write_text(f"{digest}  {image.name}\n")
    except OSError:
        return
    _say(f"recorded in {sha256_record(image)} (submits record it in the trial's manifest)")

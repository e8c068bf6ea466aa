"""`rlkit image check` and the checks of `rlkit image build` before anything runs. Images are written here in the
SIF layout of sylabs/sif (spec 01: a 128-byte header, 585-byte descriptors, little-endian), since Apptainer
cannot run on this machine to build a real one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import rlkit
from rlkit.errors import UserError
from rlkit.images.pins import expected_labels, load_pins
from rlkit.images.sif import DEFFILE_TYPE, DESCRIPTOR, HEADER, PARTITION_TYPE, read_sif
from rlkit.launch.images import build_argv, check_image, plan_build, repo_root, run_build, sha256_of
from tests.conftest import REPO, run_rlkit
from tests.helpers.submitit_fakes import QueuedForever

DATA_OFFSET = 4096 + 48 * DESCRIPTOR.size  # where sylabs/sif puts data after its 48 default descriptors


def write_sif(path: Path, deffile: str | None, *, partition: bool = True) -> Path:
    """A SIF file as `apptainer build` lays it out: Def.FILE object, then a (tiny, fake) squashfs partition."""
    objects = ([(DEFFILE_TYPE, deffile.encode())] if deffile is not None else [])
    objects += [(PARTITION_TYPE, b"hsqs" + bytes(1020))] if partition else []
    descriptors, data, offset = b"", b"", DATA_OFFSET
    for i, (kind, blob) in enumerate(objects, 1):
        descriptors += DESCRIPTOR.pack(kind, True, i, 0xF0000001, 0, offset, len(blob), len(blob), 0, 0, 0, 0,
                                       b"", b"")
        data += blob
        offset += len(blob)
    descriptors += bytes(DESCRIPTOR.size * (48 - len(objects)))  # unused descriptors are zeros
    header = HEADER.pack(b"#!/usr/bin/env run-singularity\n", b"SIF_MAGIC\0", b"01\0", b"02\0", bytes(16), 0, 0,
                         48 - len(objects), 48, 4096, len(objects) * DESCRIPTOR.size, DATA_OFFSET, len(data))
    path.write_bytes(header + bytes(4096 - len(header)) + descriptors + data)
    return path


def test_the_sif_layout_matches_the_spec_sizes() -> None:
    assert (HEADER.size, DESCRIPTOR.size) == (128, 585)


def test_an_image_built_from_this_checkouts_definition_is_usable(tmp_path: Path) -> None:
    deffile = (REPO / "containers" / "trainer.def").read_text()
    image = write_sif(tmp_path / "trainer.sif", deffile)
    sif = read_sif(image)
    assert (sif.version, sif.arch, sif.deffile, sif.has_partition) == ("01", "02", deffile, True)
    report = check_image(image, digest=True)
    assert report.problems == []
    assert report.labels == expected_labels("trainer", load_pins(), rlkit.__version__)
    assert report.sha256 == sha256_of(image) and len(report.sha256) == 64

    result = run_rlkit("image", "check", str(image))
    assert result.returncode == 0, result.stderr
    assert "usable (trainer)" in result.stdout and "org.rlkit.flash-attn" in result.stdout


def test_an_image_of_other_versions_is_refused_naming_each_label(tmp_path: Path) -> None:
    pins = load_pins()
    deffile = (REPO / "containers" / "vllm.def").read_text().replace(
        f"org.rlkit.vllm {pins.versions['vllm']}", "org.rlkit.vllm 0.9.0").replace("    org.rlkit.torch 2.13.0\n", "")
    image = write_sif(tmp_path / "old.sif", deffile)
    problems = check_image(image).problems
    assert problems == [f"label org.rlkit.vllm is 0.9.0, this rlkit needs {pins.versions['vllm']}: rebuild with "
                        "`rlkit image build vllm`",
                        f"label org.rlkit.torch missing, this rlkit needs {pins.versions['torch']}: rebuild with "
                        "`rlkit image build vllm`"]
    result = run_rlkit("image", "check", str(image))
    assert result.returncode == 2 and "org.rlkit.vllm is 0.9.0" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: p, "no such file"),
    (lambda p: (p.mkdir(), p)[1], "not a regular file"),
    (lambda p: (p.write_bytes(b"hsqs" + bytes(200)), p)[1], "not a SIF image"),
    (lambda p: write_sif(p, None), "no definition file embedded"),
    (lambda p: write_sif(p, "Bootstrap: docker\nFrom: ubuntu:24.04\n%labels\n    maintainer me\n"),
     "not an rlkit image"),
    (lambda p: write_sif(p, (REPO / "containers" / "sglang.def").read_text(), partition=False),
     "holds no filesystem partition"),
])
def test_what_is_not_a_usable_image_is_named(tmp_path: Path, make, reason: str) -> None:  # type: ignore[no-untyped-def]
    image = make(tmp_path / "x.sif")
    problems = check_image(image).problems
    assert problems and reason in problems[0], problems


def test_a_truncated_image_is_refused_not_read_past_its_end(tmp_path: Path) -> None:
    image = write_sif(tmp_path / "cut.sif", (REPO / "containers" / "vllm.def").read_text())
    image.write_bytes(image.read_bytes()[:DATA_OFFSET + 10])
    assert "points outside the file" in check_image(image).problems[0]


def test_build_is_checked_before_anything_runs(tmp_path: Path) -> None:
    root, target, argv = plan_build("vllm", tmp_path / "v.sif", None, force=False)
    assert (root, target) == (REPO, tmp_path / "v.sif")
    assert argv == ["apptainer", "build", str(tmp_path / "v.sif"), "containers/vllm.def"]
    assert build_argv("trainer", tmp_path / "t.sif", force=True)[:3] == ["apptainer", "build", "--force"]
    (tmp_path / "v.sif").write_text("old")
    for args, message in [(("gpu", None, None), "unknown image role 'gpu'"),
                          (("vllm", tmp_path / "v.sif", None), "exists"),
                          (("vllm", tmp_path / "nodir" / "v.sif", None), "is not a writable directory"),
                          (("vllm", None, tmp_path), "is not an rlkit checkout")]:
        with pytest.raises(UserError, match=message):
            plan_build(*args, force=False)  # type: ignore[arg-type]
    assert repo_root(None) == REPO
    # `--out ''` arrives as the current directory: with --force, apptainer would have built over it
    with pytest.raises(UserError, match="is a directory, not an image file"):
        plan_build("vllm", tmp_path, None, force=True)


def test_build_without_apptainer_exits_2_with_the_fix(tmp_path: Path) -> None:
    result = run_rlkit("image", "build", "trainer", "--out", str(tmp_path / "t.sif"))
    assert result.returncode == 2, result
    assert "apptainer is not installed on this machine" in result.stderr and "--on-cluster" in result.stderr
    assert not (tmp_path / "t.sif").exists()
    result = run_rlkit("image", "build", "trainer", "--time", "0")
    assert result.returncode == 2 and "must be at least 1" in result.stderr


def test_an_empty_repo_is_refused_by_name_not_taken_as_the_current_directory(tmp_path: Path) -> None:
    # from inside a checkout, `--repo ''` (as a Path: '.') went on to build from wherever the shell stood
    result = run_rlkit("image", "build", "trainer", "--repo", "", "--out", str(tmp_path / "t.sif"))
    assert result.returncode == 2 and "--repo is empty" in result.stderr, result
    assert "not an rlkit checkout" not in result.stderr and "apptainer is not installed" not in result.stderr
    assert not (tmp_path / "t.sif").exists()
    with pytest.raises(UserError, match="--repo is empty"):
        plan_build("vllm", tmp_path / "v.sif", "", force=False)


def test_the_build_jobs_body_names_the_node_without_apptainer(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"apptainer is not installed on node .*--partition"):
        run_build(["apptainer", "build", str(tmp_path / "t.sif"), "containers/trainer.def"], str(REPO))
    with pytest.raises(RuntimeError, match=r"failed on .* \(exit 3\):\nbroken"):
        run_build(["sh", "-c", "echo broken; exit 3", "t.sif", "x.def"], str(tmp_path))


def test_a_build_time_past_the_partitions_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The partition as `scontrol show partition` would describe a site's 2-hour partition."""
    from rlkit.launch import images, preflight

    short = preflight.Partition("short", up=True, max_time_s=7200, max_nodes=None, max_mem_per_node_mb=None,
                                nodes=())
    monkeypatch.setattr(preflight, "read_partition", lambda name: (short, ["short", "long"]))
    images._check_partition("short", 120)
    with pytest.raises(UserError, match="--time 121 exceeds partition short's limit of 0-02:00:00"):
        images._check_partition("short", 121)


def test_submit_names_an_image_of_another_role_or_version_and_takes_the_right_one(grpo_yaml: Path,
                                                                                    tmp_path: Path) -> None:
    """The config runs vLLM servers and an FSDP trainer: the images given the other way round are both named at
    once, an image of another vLLM version too; the right images, and a user's own unlabelled image, pass."""
    from rlkit.config.load import load_config
    from tests.conftest import raise_problems

    defs = {role: (REPO / "containers" / f"{role}.def").read_text() for role in ("trainer", "vllm", "sglang")}
    images = {role: write_sif(tmp_path / f"{role}.sif", text) for role, text in defs.items()}
    own = write_sif(tmp_path / "own.sif", "Bootstrap: docker\nFrom: nvcr.io/nvidia/pytorch:25.01-py3\n")
    old = write_sif(tmp_path / "old.sif", defs["vllm"].replace("org.rlkit.vllm 0.32.0", "org.rlkit.vllm 0.30.0"))

    def config(server: Path, trainer: Path):  # type: ignore[no-untyped-def]
        return load_config(grpo_yaml, ["launcher.slurm.container_type=apptainer",
                                       f"launcher.slurm.inference_server_image={server}",
                                       f"launcher.slurm.trainer_image={trainer}"])

    with pytest.raises(UserError) as refused:
        raise_problems(config(images["trainer"], images["sglang"]))
    message = str(refused.value)
    assert f"inference_server_image {images['trainer']}: it is rlkit's trainer image, this job needs its vllm " \
           "image: build it with `rlkit image build vllm`" in message
    assert "trainer_image" in message and "it is rlkit's sglang image, this job needs its trainer image" in message
    with pytest.raises(UserError, match=r"label org\.rlkit\.vllm is 0\.30\.0, this rlkit needs 0\.32\.0"):
        raise_problems(config(old, images["trainer"]))
    raise_problems(config(images["vllm"], images["trainer"]))
    raise_problems(config(own, own))


def test_the_manifest_records_labels_and_a_checked_images_sha256(tmp_path: Path) -> None:
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import read_manifest, write_manifest

    image = write_sif(tmp_path / "vllm.sif", (REPO / "containers" / "vllm.def").read_text())
    paths = TrialPaths.of(str(tmp_path / "root"), "exp", "t1")
    paths.root.mkdir(parents=True)
    write_manifest(paths, job_id="1", images={"inference_server": str(image)}, cwd=tmp_path)
    facts = read_manifest(paths)["images"]["inference_server"]
    assert facts["labels"] == expected_labels("vllm", load_pins(), rlkit.__version__) and "sha256" not in facts

    result = run_rlkit("image", "check", "--sha256", str(image))
    assert result.returncode == 0 and f"recorded in {image}.sha256" in result.stdout, result
    assert (tmp_path / "vllm.sif.sha256").read_text() == f"{sha256_of(image)}  vllm.sif\n"
    write_manifest(paths, job_id="2", images={"inference_server": str(image)}, cwd=tmp_path)
    assert read_manifest(paths)["images"]["inference_server"]["sha256"] == sha256_of(image)

    # a rebuilt image makes the recorded digest stale: it is not recorded; nor is a file that holds no digest
    os.utime(image, (time.time() + 60, time.time() + 60))
    write_manifest(paths, job_id="3", images={"inference_server": str(image)}, cwd=tmp_path)
    assert "sha256" not in read_manifest(paths)["images"]["inference_server"]
    (tmp_path / "vllm.sif.sha256").write_text("$(rm -rf ~) vllm.sif\n")
    os.utime(tmp_path / "vllm.sif.sha256", (time.time() + 120, time.time() + 120))
    write_manifest(paths, job_id="4", images={"inference_server": str(image)}, cwd=tmp_path)
    assert "sha256" not in read_manifest(paths)["images"]["inference_server"]


def test_a_build_job_that_never_finishes_is_left_running_with_its_id_and_how_to_follow_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rlkit.errors import SlurmError
    from rlkit.launch import images

    job = QueuedForever()
    monkeypatch.setattr(images, "_check_partition", lambda *_: None)
    monkeypatch.setattr(images, "submit_function", lambda *args, **kwargs: job)
    said: list[str] = []
    argv = ["apptainer", "build", str(tmp_path / "t.sif"), "containers/trainer.def"]
    started = time.monotonic()
    try:
        with pytest.raises(SlurmError) as raised:
            images.build_on_cluster(argv, REPO, partition=None, time_min=60, cpus=1, say=said.append,
                                    wait_min=0.01)
    finally:
        job.release.set()
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert "the image build job (Slurm job 4242) has not finished after 0.01 minutes of waiting" in message
    assert "it keeps running: follow it with `squeue -j 4242`" in message and "cancel it with `scancel 4242`" in message
    assert "waiting up to 0.01 minutes" in said[0]


def test_the_build_job_is_waited_for_its_time_limit_and_the_queue(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.launch import images

    waited: list[float] = []
    monkeypatch.setattr(images, "_check_partition", lambda *_: None)
    monkeypatch.setattr(images, "submit_function", lambda *args, **kwargs: QueuedForever())
    monkeypatch.setattr(images, "wait_for_job", lambda job, limit_s, *_: waited.append(limit_s) or job.release.set())
    argv = ["apptainer", "build", str(tmp_path / "t.sif"), "containers/trainer.def"]
    monkeypatch.setattr(QueuedForever, "result", lambda self: None)
    assert images.build_on_cluster(argv, REPO, partition=None, time_min=90, cpus=1, say=print) == "4242"
    assert waited == [(90 + images.QUEUE_WAIT_MIN) * 60]
    result = run_rlkit("image", "build", "trainer", "--on-cluster", "--wait", "0", "--cpus", "0")
    assert result.returncode == 2 and "--cpus 0, --wait 0: must be at least 1" in result.stderr, result

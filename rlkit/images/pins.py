"""The pinned versions of rlkit's Apptainer images (pins.txt) and what each role's image must carry.

One file serves three readers: the definitions in containers/ install with it as pip constraints, a built image's
`%test` runs `python3 -m rlkit.images.pins ROLE` to fail the build when a pinned package is missing or at
another version (no silently skipped flash-attn), and `rlkit image check` holds an image's labels to it.
Importing this module imports no torch: the checks import the role's modules only when asked to.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

ROLES = ("trainer", "vllm", "sglang")
# the pinned distributions each role's image must hold at the pinned version (and carries as labels)
ROLE_PACKAGES: dict[str, tuple[str, ...]] = {
    "trainer": ("torch", "transformers", "peft", "flash-attn", "safetensors", "datasets"),
    "vllm": ("vllm", "torch"),
    "sglang": ("sglang",),
}
# what a role's steps import: a build whose image cannot import one of these fails in %test
ROLE_IMPORTS: dict[str, tuple[str, ...]] = {
    "trainer": ("torch", "transformers", "peft", "flash_attn", "rlkit.cli.main", "rlkit.trainer.engine"),
    "vllm": ("vllm", "rlkit.cli.main", "rlkit.servers.vllm.plugin"),
    "sglang": ("sglang", "rlkit.cli.main", "rlkit.servers.sglang.command"),
}
LABEL_PREFIX = "org.rlkit."
_IMAGE_LINE = re.compile(r"#\s*image\s+(\w+):\s*(\S+)\s*$")
_PIN_LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


@dataclass(frozen=True)
class Pins:
    """`versions`: distribution (normalized name) -> exact version; `images`: role -> base image reference."""

    versions: dict[str, str]
    images: dict[str, str]


def normalize(name: str) -> str:
    """PyPI's name normalization (PEP 503): `Flash_Attn` and `flash-attn` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> Pins:
    """The pins of a pins.txt text; a line that is neither a pin, an image line nor a comment is an error."""
    versions: dict[str, str] = {}
    images: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if image := _IMAGE_LINE.match(line):
            images[image.group(1)] = image.group(2)
        elif pin := _PIN_LINE.match(line):
            versions[normalize(pin.group(1))] = pin.group(2)
        elif line and not line.startswith("#"):
            raise ValueError(f"pins.txt line {number}: {raw!r} is not NAME==VERSION")
    return Pins(versions, images)


def load_pins() -> Pins:
    """The pins shipped with this rlkit."""
    return parse_pins(resources.files("rlkit.images").joinpath("pins.txt").read_text())


def rlkit_labels_in(deffile: str) -> dict[str, str]:
    """The org.rlkit.* labels a definition file declares (the others are the user's own)."""
    from rlkit.images.sif import deffile_labels

    return {k: v for k, v in deffile_labels(deffile).items() if k.startswith(LABEL_PREFIX)}


def expected_labels(role: str, pins: Pins, rlkit_version: str) -> dict[str, str]:
    """The labels a `role` image built from this checkout carries (containers/ROLE.def's %labels)."""
    labels = {f"{LABEL_PREFIX}role": role, f"{LABEL_PREFIX}version": rlkit_version}
    labels |= {f"{LABEL_PREFIX}{name}": pins.versions[name] for name in ROLE_PACKAGES[role]}
    return labels


def label_problems(labels: dict[str, str], pins: Pins, rlkit_version: str, role: str | None = None) -> list[str]:
    """How an image's rlkit labels differ from what this rlkit expects of an image of its role (of `role`, when
    the image must serve one: a vllm image where the config runs SGLang is named)."""
    labelled = labels.get(f"{LABEL_PREFIX}role")
    if labelled not in ROLES:
        return [f"label {LABEL_PREFIX}role is {labelled!r}, not one of {', '.join(ROLES)}: not an rlkit image "
                "(build one with `rlkit image build ROLE`)"]
    if role is not None and labelled != role:
        return [f"it is rlkit's {labelled} image, this job needs its {role} image: build it with "
                f"`rlkit image build {role}`"]
    problems = []
    for key, want in expected_labels(labelled, pins, rlkit_version).items():
        have = labels.get(key)
        if have != want:
            what = "missing" if have is None else f"is {have}"
            problems.append(f"label {key} {what}, this rlkit needs {want}: rebuild with `rlkit image build {labelled}`")
    return problems


def public_version(version: str) -> str:
    """`2.13.0+cu130` -> `2.13.0`: a CUDA or CPU build of a release is that release."""
    return version.split("+", 1)[0]


def installed_problems(role: str, pins: Pins, *, version_of: Callable[[str], str] = importlib.metadata.version,
                       import_module: Callable[[str], object] = importlib.import_module) -> list[str]:
    """Every pinned package of `role` that is missing or at another version, and every module that fails to import."""
    problems = []
    for name in ROLE_PACKAGES[role]:
        try:
            found = public_version(version_of(name))
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed (pinned: {pins.versions[name]})")
            continue
        if found != pins.versions[name]:
            problems.append(f"{name} is {found}, pinned {pins.versions[name]}")
    for module in ROLE_IMPORTS[role]:
        try:
            import_module(module)
        except Exception as exc:  # an image whose module fails to import in any way is a broken build
            problems.append(f"import {module} failed: {type(exc).__name__}: {exc}")
    return problems


def main(argv: list[str]) -> int:
    """`python3 -m rlkit.images.pins ROLE`: the %test of an image; exit 1 with every problem, 0 when sound."""
    if len(argv) != 1 or argv[0] not in ROLES:
        print(f"usage: python3 -m rlkit.images.pins {{{','.join(ROLES)}}}", file=sys.stderr)
        return 2
    problems = installed_problems(argv[0], load_pins())
    for problem in problems:
        print(f"image check ({argv[0]}): {problem}", file=sys.stderr)
    if not problems:
        print(f"image check ({argv[0]}): every pinned package at its version, every module imports")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""What an image reference says about itself without Apptainer: whether Apptainer fetches it (a URI), and the rlkit
labels of a local SIF built by `rlkit image build` (its role, rlkit version and pins)."""

from __future__ import annotations

from pathlib import Path

from rlkit.images.pins import rlkit_labels_in
from rlkit.images.sif import SifError, read_sif

_IMAGE_URI = ("docker://", "docker-archive://", "oras://", "library://", "shub://", "http://", "https://")


def is_image_uri(image: str) -> bool:
    """An image Apptainer fetches itself (not a local file we can check)."""
    return image.startswith(_IMAGE_URI)


def rlkit_labels(image: str) -> dict[str, str] | None:
    """The rlkit labels of a local SIF image; None when it is not one rlkit can read or has none (a user's own
    image: its versions are the user's business, `rlkit image check` says what it lacks)."""
    if not image or is_image_uri(image):
        return None
    try:
        sif = read_sif(Path(image))
    except (SifError, OSError, ValueError):
        return None
    return rlkit_labels_in(sif.deffile or "") or None

"""Checks of the site's files a job will use: images, models, tokenizers, datasets and the fileroot.

Each raises ConfigError with `site=True`: `rlkit submit` refuses such a config, while `rlkit render` (a dry run,
often on a laptop or a login node without the site's files) prints the script and lists these as warnings.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlkit.errors import ConfigError

_IMAGE_URI = ("docker://", "docker-archive://", "oras://", "library://", "shub://", "http://", "https://")
DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def is_image_uri(image: str) -> bool:
    """An image Apptainer fetches itself (not a local file we can check)."""
    return image.startswith(_IMAGE_URI)


def is_local_path(value: str) -> bool:
    """A model/tokenizer value that names a directory here (a hub id like org/name is left to the servers)."""
    return value.startswith(("/", "."))


def check_image(field: str, image: str) -> None:
    if not image:
        raise ConfigError(f"{field} is empty but launcher.slurm.container_type is apptainer",
                          hint=f"set {field}=/path/to/image.sif, or launcher.slurm.container_type=none")
    if not is_image_uri(image) and not Path(image).is_file():
        raise ConfigError(f"{field}: image file '{image}' does not exist",
                          hint="build it from containers/ (apptainer build) or point to an existing .sif", site=True)


def check_model_dir(field: str, value: str) -> None:
    """A local model path (absolute or relative) must be a Hugging Face model directory; hub ids are not checked."""
    if is_local_path(value) and not (Path(value) / "config.json").is_file():
        raise ConfigError(f"{field}: '{value}' is not a model directory (no config.json)",
                          hint="point to a Hugging Face model directory on the shared filesystem", site=True)


def check_tokenizer_dir(field: str, value: str) -> None:
    """A local tokenizer (or model) directory must hold tokenizer files."""
    if is_local_path(value) and not any((Path(value) / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{field}: '{value}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                          hint="copy the tokenizer files next to the model, or set tokenizer_path to a tokenizer "
                               "directory", site=True)


def check_dataset_file(field: str, value: str) -> None:
    """A dataset must be a local .jsonl/.json/.parquet file or a directory of them."""
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"{field}: '{value}' does not exist", hint="give the path of a .jsonl or .parquet file",
                          site=True)
    if path.is_file() and path.suffix not in DATASET_SUFFIXES:
        raise ConfigError(f"{field}: '{value}' is not a .jsonl or .parquet file")


def check_writable_root(field: str, trial_dir: Path) -> None:
    """The trial directory (or the nearest directory above it that exists) must be writable by this user."""
    existing = trial_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{field}: '{existing}' is not a directory, so {trial_dir} cannot be created",
                          hint="point cluster.fileroot to a directory on the shared filesystem", site=True)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: {existing} is not writable by you, so {trial_dir} cannot be created",
                          hint="point cluster.fileroot to a directory you own on the shared filesystem", site=True)

"""Checks of the site's files a job will use: images, models, tokenizers, datasets and the fileroot.

Each raises ConfigError with `site=True`: `rlkit submit` refuses such a config, while `rlkit render` (a dry run,
often on a laptop or a login node without the site's files) prints the script and lists these as warnings.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rlkit import untrusted_json
from rlkit.config.model_config import is_local_path
from rlkit.config.schema.auxiliary import model_path_fields
from rlkit.config.schema.experiment import get_field, set_field
from rlkit.config.schema.reasoning_gym import names_reasoning_gym
from rlkit.data.dataset_rows import check_parquet_files
from rlkit.data.files import SUFFIX_FORMAT
from rlkit.errors import ConfigError
from rlkit.images.labels import is_image_uri

DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


_Check = TypeVar("_Check", bound=Callable[..., None])


def _os_errors_named(check: _Check) -> _Check:
    """A path the user may not read (EACCES), or cannot name (ENAMETOOLONG), is a problem naming the field, not a
    traceback: Python raises those from exists()/is_file() instead of answering False."""

    @functools.wraps(check)
    def checked(field: str, value: object, *args: object) -> None:
        try:
            check(field, value, *args)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte (also reported as a control character)
            raise ConfigError(f"{field}: {value!r} cannot be checked here: {getattr(exc, 'strerror', None) or exc}",
                              hint="check the path, and that you may read every directory on it", site=True) from None

    return checked  # type: ignore[return-value]


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def is_hub_id(value: object) -> bool:
    """A Hugging Face hub id, `org/name`, that is not a path here: no leading `/`, `.` or `~`, no data-file suffix,
    nothing at that relative path. rlkit.launch.hub fetches it at submit (and reports it when it cannot)."""
    return (isinstance(value, str) and _HUB_ID.fullmatch(value) is not None
            and not value.endswith(DATASET_SUFFIXES) and not Path(value).exists())


@_os_errors_named
def check_image(field: str, image: str) -> None:
    if not image:
        raise ConfigError(f"{field} is empty but launcher.slurm.container_type is apptainer",
                          hint=f"set {field}=/path/to/image.sif, or launcher.slurm.container_type=none")
    if not is_image_uri(image) and not Path(image).is_file():
        raise ConfigError(f"{field}: image file '{image}' does not exist",
                          hint="build it from containers/ (apptainer build) or point to an existing .sif", site=True)


@_os_errors_named
def check_model_dir(field: str, value: str) -> None:
    """A local model path (absolute or relative) must be a Hugging Face model directory; hub ids are not checked."""
    if is_local_path(value) and not (Path(value) / "config.json").is_file():
        raise ConfigError(f"{field}: '{value}' is not a model directory (no config.json)",
                          hint="point to a Hugging Face model directory on the shared filesystem", site=True)


@_os_errors_named
def check_tokenizer_dir(field: str, value: str) -> None:
    """A local tokenizer (or model) directory must hold tokenizer files."""
    if is_local_path(value) and not any((Path(value) / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{field}: '{value}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})",
                          hint="copy the tokenizer files next to the model, or set tokenizer_path to a tokenizer "
                               "directory", site=True)


@_os_errors_named
def check_chat_template(field: str, value: str, why: str) -> None:
    """A local tokenizer that must render chats has a chat template (in tokenizer_config.json or a chat_template
    file beside it): without one transformers refuses apply_chat_template, in the job, after the queue wait."""
    directory = Path(value)
    if not is_local_path(value) or not directory.is_dir():
        return  # a hub id, or a missing directory (reported by the model check)
    if any((directory / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return
    try:
        settings = untrusted_json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        settings = {}
    if not (isinstance(settings, dict) and settings.get("chat_template")):
        raise ConfigError(f"{field}: the tokenizer in '{value}' has no chat template, but {why}",
                          hint="use a tokenizer with a chat template (an instruct/chat model's), give one in "
                               "sft.chat_template (sft), or use text rows", site=True)


@_os_errors_named
def check_dataset_file(field: str, value: str) -> None:
    """A dataset must be a local .jsonl/.json/.parquet file or a directory of them (reasoning-gym's generated rows
    are checked by rlkit.checks.reasoning_gym where a job type reads them)."""
    if names_reasoning_gym(value):
        raise ConfigError(f"{field}: '{value}': reasoning-gym rows are generated only as the prompts of grpo, ppo, "
                          "opmd and distill (train_dataset, valid_dataset) and generate (generate.dataset)",
                          hint=f"give {field} a .jsonl or .parquet file (rows exported from reasoning-gym, for "
                               "instance)")
    if is_hub_id(value):
        return  # a hub id not fetched (render, or before submit's download): rlkit.launch.hub reports it
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"{field}: '{value}' does not exist", hint="give the path of a .jsonl or .parquet file",
                          site=True)
    if path.is_file() and path.suffix not in DATASET_SUFFIXES:
        raise ConfigError(f"{field}: '{value}' is not a .jsonl or .parquet file")
    if path.is_dir():  # the job reads every file of these types in it (rlkit.data.files), of one type only
        kinds = {SUFFIX_FORMAT[p.suffix] for p in path.iterdir() if p.suffix in SUFFIX_FORMAT}
        if not kinds:
            raise ConfigError(f"{field}: the directory '{value}' holds no .jsonl, .json or .parquet file",
                              hint="give a directory of dataset files, or the path of one file", site=True)
        if len(kinds) > 1:
            raise ConfigError(f"{field}: the directory '{value}' mixes JSON and Parquet files",
                              hint="keep the files of one format in it, or give one file")
    check_parquet_files(field, path)  # a .jsonl file's first rows are read by the job types' own checks


@_os_errors_named
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


# Fields that name files on the shared filesystem. Steps run from `/` on other nodes, so a relative path written in
# the YAML (or on the command line) means "relative to where `rlkit submit` ran" and is made absolute there.
_LOCAL_FILE_FIELDS = ("train_dataset.path", "valid_dataset.path", "expert_dataset.path", "generate.dataset.path",
                      "launcher.slurm.trainer_image", "launcher.slurm.inference_server_image",
                      "stats_logger.tensorboard.path", "stats_logger.swanlab.logdir")
# Fields that hold a local directory only when written as one (./x, ../x, /x); `org/name` is a hub id.
_MODEL_FIELDS = ("actor.path", "vllm.model", "sglang.model_path", "tokenizer_path", "reward.reward_model_path",
                 "ref.path")


def make_paths_absolute(config: object, cwd: str) -> None:
    """Rewrite relative local paths of `config` as absolute paths under `cwd` (the submitting directory)."""
    models = (*_MODEL_FIELDS, *model_path_fields(config))
    for dotted in (*_LOCAL_FILE_FIELDS, *models):
        value = get_field(config, dotted)
        if not isinstance(value, str) or not value or value.startswith(("/", "~")) or is_image_uri(value):
            continue
        if (dotted in models and not is_local_path(value)) or is_hub_id(value) or names_reasoning_gym(value):
            continue
        set_field(config, dotted, os.path.normpath(os.path.join(cwd, value)))

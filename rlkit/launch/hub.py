"""Hugging Face hub ids for models and datasets (`Qwen/Qwen2.5-1.5B-Instruct`, `openai/gsm8k`), fetched on the login
node at submit into a cache on the shared filesystem, so that compute nodes never download (they often cannot, and
N nodes downloading at once is how a job starts an hour late). The trial's config.yaml records the local paths.

The cache is `cluster.hub_cache` (default `<fileroot>/hub-cache`), in the hub's own layout (huggingface_hub's
`snapshot_download`, which honours HF_TOKEN and HF_ENDPOINT). `render` only looks in the cache: an id not there yet
is a warning, as a missing local file is. A dataset id becomes the files of one split (`split` of the dataset
section, default train for train_dataset and test for valid_dataset) of its `main` or `default` configuration, or of
its only one; several files are linked into one directory under the cache, which rlkit reads as one dataset.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlkit.checks.site_files import DATASET_SUFFIXES, is_hub_id
from rlkit.config.problems import Problems
from rlkit.config.schema.auxiliary import model_path_fields
from rlkit.config.schema.experiment import ExperimentConfig, get_field, set_field
from rlkit.errors import ConfigError

MODEL_FIELDS = ("actor.path", "tokenizer_path", "critic.path", "ref.path", "dpo.ref_path",
                "reward.reward_model_path", "vllm.model", "sglang.model_path")
DATASET_FIELDS = {"train_dataset.path": "train", "valid_dataset.path": "test", "generate.dataset.path": "train"}
_PREFERRED_CONFIGS = ("main", "default")
SPLITS_DIR = "rlkit-splits"  # under the cache: one directory of links per (dataset, configuration, split)


class NotInHubCache(ConfigError):
    """A hub id that `render` (looking only) did not find in the cache: submit downloads it."""


def has_hub_ids(config: ExperimentConfig) -> bool:
    return any(is_hub_id(get_field(config, field)) for field in (*model_fields(config), *DATASET_FIELDS))


def model_fields(config: ExperimentConfig) -> tuple[str, ...]:
    """Every field naming a model: the fixed ones and each auxiliary model's model_path."""
    return (*MODEL_FIELDS, *model_path_fields(config))


def hub_cache(config: ExperimentConfig) -> Path:
    return Path(config.cluster.hub_cache or os.path.join(config.cluster.fileroot, "hub-cache"))


def resolve_hub_ids(config: ExperimentConfig, problems: Problems, *, download: bool) -> None:
    """Replace every hub id among the model and dataset fields of `config` by its local copy in the cache,
    downloading it first when `download` (submit) or only looking (render). Each id that cannot be had goes to
    `problems` naming the id, the cache and the fix (a site problem: render warns)."""
    cache = hub_cache(config)
    done: dict[tuple[str, str], str] = {}
    for field in model_fields(config):
        repo = get_field(config, field)
        if is_hub_id(repo):
            with problems.check():
                local = done.get((repo, "model")) or _snapshot(field, repo, "model", cache, download)
                done[(repo, "model")] = local
                set_field(config, field, local)
    for field, default_split in DATASET_FIELDS.items():
        repo = get_field(config, field)
        if is_hub_id(repo):
            split = get_field(config, field.rsplit(".", 1)[0]).split or default_split
            with problems.check():
                snapshot = Path(_snapshot(field, repo, "dataset", cache, download))
                set_field(config, field, str(_split_files(field, repo, snapshot, split, cache, write=download)))


def _snapshot(field: str, repo: str, kind: str, cache: Path, download: bool) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return str(snapshot_download(repo, repo_type=kind, cache_dir=cache, local_files_only=not download))
    except LocalEntryNotFoundError:
        how = ("the hub cannot be reached from here" if download else
               "render only looks in the cache; `rlkit submit` downloads it")
        raise NotInHubCache(f"{field}: the {kind} '{repo}' is not in the hub cache {cache} ({how})",
                          hint=f"run the submit where the hub is reachable (HF_ENDPOINT for a mirror), or download "
                               f"it yourself and set {field} to its local path", site=True) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ConfigError(f"{field}: cannot fetch the {kind} '{repo}' into {cache}: {str(exc).splitlines()[0]}",
                          hint=f"check the id (and HF_TOKEN for a gated {kind}), or set {field} to a local path",
                          site=True) from None


def _split_files(field: str, repo: str, snapshot: Path, split: str, cache: Path, *, write: bool) -> Path:
    """The one file of `split`, or a directory of links to its shards; the configuration is `main`/`default` or the
    only one the dataset has."""
    by_config: dict[str, list[Path]] = {}
    for path in sorted(snapshot.rglob("*")):
        of_split = path.name.startswith((f"{split}-", f"{split}.")) or path.parent.name == split
        if path.suffix in DATASET_SUFFIXES and of_split:
            config_dir = path.relative_to(snapshot).parts[0] if len(path.relative_to(snapshot).parts) > 1 else ""
            config_dir = "" if config_dir in ("data", split) else config_dir
            by_config.setdefault(config_dir, []).append(path)
    if not by_config:
        raise ConfigError(f"{field}: the dataset '{repo}' has no '{split}' split in {snapshot}",
                          hint=f"set {field.rsplit('.', 1)[0]}.split to one of its splits")
    chosen = next((c for c in ("", *_PREFERRED_CONFIGS) if c in by_config), None)
    if chosen is None and len(by_config) == 1:
        chosen = next(iter(by_config))
    if chosen is None:
        raise ConfigError(f"{field}: the dataset '{repo}' has several configurations ({', '.join(sorted(by_config))})"
                          " and none is main or default", hint=f"download the one you want and set {field} to its "
                                                               "file")
    files = by_config[chosen]
    if len(files) == 1 or not write:
        return files[0]  # render writes nothing: its checks read the first rows only
    if len({f.suffix for f in files}) > 1:
        raise ConfigError(f"{field}: the '{split}' split of '{repo}' mixes file types", hint=f"set {field} to a file")
    links = cache / SPLITS_DIR / repo.replace("/", "--") / (chosen or "default") / split
    links.mkdir(parents=True, exist_ok=True)
    for file in files:
        link = links / file.name
        if not link.is_symlink():
            link.symlink_to(file)
    return links

"""Hub ids for models and datasets resolve on the login node into the hub cache (rlkit.launch.hub).

The hub itself cannot be reached from this machine: these tests populate a cache in the hub's own layout
(`models--org--name/refs/main` + `snapshots/<commit>/...`, as huggingface_hub writes it) and run with
HF_HUB_OFFLINE=1, so submit's download path runs against the cache exactly as it would after a real download.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.checks.site_files import is_hub_id
from rlkit.errors import ConfigError
from rlkit.launch.hub import SPLITS_DIR
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache: Path, kind: str, repo: str) -> Path:
    """An empty snapshot of `repo` in the hub cache layout; returns its directory."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    return snapshot


def _parquet(path: Path, first: int, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"prompt": [f"{i}+1=" for i in range(first, first + n)],
                             "answer": [str(i + 1) for i in range(first, first + n)]}), path)


@pytest.fixture
def cache(tmp_path: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding model acme/tiny-model and dataset openai/gsm8k (main: train in two shards, test in one;
    socratic: another configuration rlkit must not pick)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub-cache"
    model = _snapshot(cache, "model", "acme/tiny-model")
    (fake_model / "tokenizer.json").write_text("{}")
    for file in fake_model.iterdir():
        shutil.copy(file, model / file.name)
    data = _snapshot(cache, "dataset", "openai/gsm8k")
    _parquet(data / "main" / "train-00000-of-00002.parquet", 0, 8)
    _parquet(data / "main" / "train-00001-of-00002.parquet", 8, 8)
    _parquet(data / "main" / "test-00000-of-00001.parquet", 100, 4)
    _parquet(data / "socratic" / "train-00000-of-00001.parquet", 200, 4)
    return cache


def _hub_overrides(cache: Path) -> list[str]:
    return [f"cluster.hub_cache={cache}", "actor.path=acme/tiny-model", "train_dataset.path=openai/gsm8k",
            "valid_dataset.path=openai/gsm8k", "valid_dataset.batch_size=4", "evaluator.freq_steps=1"]


def test_what_counts_as_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("openai/gsm8k") and is_hub_id("Qwen/Qwen2.5-1.5B-Instruct")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gsm8k").mkdir()
    assert not is_hub_id("data/gsm8k"), "a relative path that exists here is a path"
    for value in ("/abs/model", "./model", "~/model", "data/train.jsonl", "model", "a/b/c", ""):
        assert not is_hub_id(value), value


def test_render_and_submit_read_the_cache_and_record_local_paths(grpo_yaml: Path, cache: Path) -> None:
    rendered = prepare(grpo_yaml, _hub_overrides(cache), dry_run=True)
    snapshot = cache / "models--acme--tiny-model" / "snapshots" / COMMIT
    assert rendered.config.actor.path == str(snapshot)
    assert rendered.config.valid_dataset.path == str(
        cache / "datasets--openai--gsm8k" / "snapshots" / COMMIT / "main" / "test-00000-of-00001.parquet")
    assert not (cache / SPLITS_DIR).exists(), "render writes nothing"
    submitted = prepare(grpo_yaml, _hub_overrides(cache))  # the download path, offline against the cache
    train = Path(submitted.config.train_dataset.path)
    assert train == cache / SPLITS_DIR / "openai--gsm8k" / "main" / "train"
    assert sorted(p.name for p in train.iterdir()) == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert all(p.resolve().parent.name == "main" for p in train.iterdir()), "main, never socratic"
    from rlkit.data.files import load_rows

    assert [row["prompt"] for row in load_rows(train)] == [f"{i}+1=" for i in range(16)], "both shards, in order"


def test_a_reference_given_as_a_hub_id_is_fetched_like_the_actor(grpo_yaml: Path, cache: Path,
                                                                  fake_model: Path) -> None:
    """ref.path (the KL reference, e.g. the SFT model the actor's checkpoint came from) may be a hub id: fetched
    into the same cache, checked as the local copy, recorded as its path."""
    overrides = [f"cluster.hub_cache={cache}", f"actor.path={fake_model}", "actor.kl_ctl=0.1",
                 "ref.path=acme/tiny-model"]
    rendered = prepare(grpo_yaml, overrides, dry_run=True)
    assert rendered.config.ref.path == str(cache / "models--acme--tiny-model" / "snapshots" / COMMIT)
    with pytest.raises(ConfigError) as refused:
        prepare(grpo_yaml, [*overrides[:-1], "ref.path=acme/missing-model"])
    assert "ref.path: the model 'acme/missing-model' is not in the hub cache" in str(refused.value)


def test_an_id_not_in_the_cache_is_named_with_the_cache(grpo_yaml: Path, cache: Path) -> None:
    """Submit downloads nothing for a config it refuses: a bad split comes first, alone; once it is fixed, the
    download of the missing model is tried (offline here) and its failure names the id and the cache."""
    overrides = [*_hub_overrides(cache), "actor.path=acme/missing-model", "valid_dataset.split=validation"]
    with pytest.raises(ConfigError) as refused:
        prepare(grpo_yaml, overrides)
    assert "the dataset 'openai/gsm8k' has no 'validation' split" in str(refused.value)
    assert "missing-model" not in str(refused.value), "not fetched: the config is refused anyway"
    with pytest.raises(ConfigError) as refused:
        prepare(grpo_yaml, overrides[:-1])
    assert (f"actor.path: the model 'acme/missing-model' is not in the hub cache {cache} (the hub cannot be "
            "reached from here)") in str(refused.value)
    rendered = run_rlkit("render", str(grpo_yaml), *overrides[:-1], env={"HF_HUB_OFFLINE": "1"})
    assert rendered.returncode == 0, rendered.stderr
    assert "warning: actor.path: the model 'acme/missing-model' is not in the hub cache" in rendered.stderr
    assert "render only looks in the cache" in rendered.stderr

"""A job's dataset rows (rlkit.data.files.load_rows): JSON and JSON Lines read as written, every row with every
column, a clear error naming the file and line, and never a cache entry in the user's ~/.cache/huggingface (on a
cluster that is NFS, where `datasets`' file locks fail or hang)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.data.files import load_rows
from rlkit.errors import StepError

REPO = Path(__file__).resolve().parents[3]


def _jsonl(path: Path, rows: list[object], *, prefix: str = "") -> Path:
    path.write_text(prefix + "\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def test_json_lines_are_read_as_written_and_every_row_gets_every_column(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1=", "answer": 2, "meta": {"a": 1}},
            {"prompt": "0.5+1=", "answer": 1.5, "meta": {"b": [1, 2]}},
            {"prompt": "x", "extra": None, "answer": "three"}]
    got = load_rows(_jsonl(tmp_path / "d.jsonl", rows, prefix="\ufeff"))  # a byte-order mark first
    assert got == [{"prompt": "1+1=", "answer": 2, "meta": {"a": 1}, "extra": None},
                   {"prompt": "0.5+1=", "answer": 1.5, "meta": {"b": [1, 2]}, "extra": None},
                   {"prompt": "x", "answer": "three", "meta": None, "extra": None}]
    assert isinstance(got[0]["answer"], int), "an integer answer stays an integer (its text is '2', not '2.0')"
    assert list(got[2]) == ["prompt", "answer", "meta", "extra"], "columns in the order first seen"


def test_a_json_list_and_a_directory_of_shards(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    (tmp_path / "texts.json").write_text(json.dumps(["one", "two"]))
    assert load_rows(tmp_path / "list.json") == [{"prompt": "a"}, {"prompt": "b"}]
    assert load_rows(tmp_path / "texts.json") == [{"text": "one"}, {"text": "two"}]
    shards = tmp_path / "shards"
    shards.mkdir()
    _jsonl(shards / "part-1.jsonl", [{"prompt": "second"}])
    _jsonl(shards / "part-0.jsonl", [{"prompt": "first"}])
    assert [r["prompt"] for r in load_rows(shards)] == ["first", "second"], "shards in name order"


@pytest.mark.parametrize(("content", "says"), [
    ('{"prompt": "a"}\n\n{"prompt": \n', "line 3 is not JSON"),
    ('{"prompt": "a"}\n[1, 2]\n', "line 2 is a list, not a JSON object"),
    ('[{"prompt": "a"}, 3]', "item 1 of its list is a int"),
    ('[{"prompt": "a"}', "is not valid JSON"),
    ('{"prompt": "a"}\n' + "[" * 100_000 + "]" * 100_000 + "\n", "line 2 is not JSON"),
])
def test_a_broken_file_is_named_with_its_line(tmp_path: Path, content: str, says: str) -> None:
    bad = tmp_path / ("bad.json" if content.startswith("[") else "bad.jsonl")
    bad.write_text(content)
    with pytest.raises(StepError, match=says) as raised:
        load_rows(bad)
    assert str(bad) in str(raised.value)
    bad.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(StepError, match="cannot be read as UTF-8 text"):
        load_rows(bad)


def test_parquet_leaves_nothing_in_the_huggingface_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    hf_cache, scratch = tmp_path / "hf-datasets-cache", tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf_cache)  # where load_dataset caches by default
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [1, 2]}), tmp_path / "d.parquet")
    assert load_rows(tmp_path / "d.parquet") == [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    assert not hf_cache.exists(), "the user's datasets cache is not touched"
    assert list(scratch.iterdir()) == [], "the temporary cache is removed"


def test_json_lines_do_not_import_datasets(tmp_path: Path) -> None:
    """The trainer's rank 0 reads a .jsonl without paying for `datasets` and pandas (~1-2 CPU-s at every start)."""
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    code = ("import sys; from rlkit.data.files import load_rows; "
            f"assert load_rows({str(data)!r}) == [{{'prompt': 'a'}}]; print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert out.stdout.strip() == "False"


def test_a_fifo_or_device_is_refused_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO blocked the submit (and the job) forever; /dev/zero was read without end."""
    from rlkit.config.load import read_yaml
    from rlkit.data import dataset_rows
    from rlkit.errors import ConfigError

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    for special in (fifo, zero):
        with pytest.raises(StepError, match="is not a regular file"):
            load_rows(special)
        with pytest.raises(ConfigError, match="is not a regular file"):
            dataset_rows.first_jsonl_rows("train_dataset.path", special, 1)
        config = special.with_suffix(".yaml")
        config.symlink_to(special)
        with pytest.raises(ConfigError, match="is not a regular file"):
            read_yaml(config)
    long = _jsonl(tmp_path / "long.jsonl", [{"prompt": "x" * 100}])
    monkeypatch.setattr(dataset_rows, "LINE_LIMIT", 64)
    with pytest.raises(ConfigError, match=r"line 1 of .* is longer than"):
        dataset_rows.first_jsonl_rows("train_dataset.path", long, 1)


@pytest.mark.parametrize("pyarrow_here", [True, False])
def test_a_corrupt_or_cut_parquet_file_is_refused_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           pyarrow_here: bool) -> None:
    """Parquet was never read at submit, so a file of other bytes or one cut short by a copy failed in the job
    (pyarrow: "Parquet magic bytes not found"), after the queue wait. Now it is named like an unreadable .jsonl,
    with or without pyarrow on the login node (rlkit's own dependencies lack it)."""
    from rlkit.checks.site_files import check_dataset_file
    from rlkit.errors import ConfigError

    if not pyarrow_here:
        monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import pyarrow.parquet` raises ImportError
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": [f"{i} + {i} =" for i in range(500)], "answer": [str(2 * i) for i in
                                                                                        range(500)]}), good)
    check_dataset_file("train_dataset.path", str(good))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(bytes(range(256)) * 8)
    whole = good.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole[:len(whole) // 2])
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "0.parquet").write_bytes(whole)
    (shards / "1.parquet").write_bytes(whole[:len(whole) // 2])
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    for path, says in ((garbage, "is not a Parquet file (it does not start with Parquet's PAR1 marker)"),
                       (cut, f"is cut short or damaged (its {len(whole) // 2} bytes do not end with a Parquet footer)"),
                       (shards, "1.parquet is cut short or damaged"), (fifo, "is not a regular file")):
        with pytest.raises(ConfigError) as info:
            check_dataset_file("train_dataset.path", str(path))
        assert info.value.message.startswith(f"train_dataset.path: {path}") and says in info.value.message
        assert info.value.hint and not info.value.site  # the file is here and broken: render refuses it too
    footer = struct.unpack("<I", whole[-8:-4])[0]
    scrambled = tmp_path / "footer.parquet"
    scrambled.write_bytes(whole[:-8 - footer] + bytes(footer) + whole[-8:])
    if pyarrow_here:
        with pytest.raises(ConfigError, match=r"footer\.parquet cannot be read as Parquet: "):
            check_dataset_file("train_dataset.path", str(scrambled))


def test_a_dataset_directory_without_data_files_or_with_two_formats_is_refused_at_submit(tmp_path: Path) -> None:
    """The job refused both (rlkit.data.files.load_rows), after the queue wait; submit names them now."""
    from rlkit.checks.site_files import check_dataset_file
    from rlkit.errors import ConfigError

    (tmp_path / "README.md").write_text("rows elsewhere")
    with pytest.raises(ConfigError, match=r"holds no \.jsonl, \.json or \.parquet file") as info:
        check_dataset_file("train_dataset.path", str(tmp_path))
    assert info.value.site  # rows may be copied in on the cluster: render warns, submit refuses
    (tmp_path / "a.jsonl").write_text('{"prompt": "1 + 1 ="}\n')
    (tmp_path / "b.json").write_text('[{"prompt": "2 + 2 ="}]')
    check_dataset_file("train_dataset.path", str(tmp_path))  # JSON Lines and JSON read alike
    pq.write_table(pa.table({"prompt": ["3 + 3 ="]}), tmp_path / "c.parquet")
    with pytest.raises(ConfigError, match="mixes JSON and Parquet files"):
        check_dataset_file("train_dataset.path", str(tmp_path))

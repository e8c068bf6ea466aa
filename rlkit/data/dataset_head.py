"""A dataset's columns and first rows on the login node, for JSON Lines and Parquet alike, so that the submit-time
column checks of every job type (prompt_key, answer key, chosen/rejected, sft's columns) need not know the format:
a wrong column name is refused at submit, not in the job after the queue wait.

A Parquet dataset's columns come from its schema (the footer) alone; row values are read only where a check needs
them (a GSM8K or hh-rlhf row's shape, the kind of a column's first value), and then only the first rows of the first
row group, of the columns asked for, streamed page by page. A directory of Parquet shards is judged by its first
file: the job reads them all into one table, which needs one schema. Without pyarrow on the login node a Parquet
dataset has no head here (only its magic bytes are checked, rlkit.data.dataset_rows): its columns are checked in the
job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlkit.data.dataset_rows import PARQUET_FIX, first_jsonl_rows, parquet_files
from rlkit.errors import ConfigError

READ_BUFFER = 2**20  # bytes: pyarrow streams a column chunk in such reads, not the whole chunk of a row group

RowReader = Callable[[int, Sequence[str] | None], list[Any]]


class DatasetHead:
    """The columns of a dataset (its first file's) and, read on demand, its first rows."""

    def __init__(self, columns: Sequence[str], read: RowReader) -> None:
        self.columns = tuple(columns)
        self._read = read

    def rows(self, count: int, columns: Sequence[str] | None = None) -> list[Any]:
        """Up to `count` first rows; Parquet's hold only those of `columns` that the dataset has (all when None)."""
        wanted = None if columns is None else [c for c in dict.fromkeys(columns) if c in self.columns]
        return self._read(count, wanted)

    def first_row(self, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """The first row if it is an object (None for a dataset with no rows in its first file)."""
        rows = self.rows(1, columns)
        return rows[0] if rows and isinstance(rows[0], dict) else None


def dataset_head(field: str, path: Path) -> DatasetHead | None:
    """The head of a .jsonl or .parquet dataset (a file or the first such file of a directory): None where its
    columns cannot be known here (other formats, a path that is not local, a JSON Lines file whose first row is no
    object, Parquet without pyarrow installed): those are checked in the job. ConfigError naming `field` for a file
    that cannot be read."""
    first = first_jsonl_rows(field, path, 1)
    if first is not None:
        if not isinstance(first[0], dict):
            return None
        return DatasetHead(list(first[0]), lambda count, _columns: first_jsonl_rows(field, path, count) or [])
    files = parquet_files(path)
    if not files or not files[0].is_file():
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    file = files[0]
    try:
        names = pq.read_schema(file).names
    except Exception as exc:  # pyarrow's ArrowInvalid/OSError: its words, not a traceback
        raise _unreadable(field, file, exc) from None

    def read(count: int, columns: Sequence[str] | None) -> list[Any]:
        try:
            batches = pq.ParquetFile(file, buffer_size=READ_BUFFER).iter_batches(batch_size=count, columns=columns)
            batch = next(iter(batches), None)
        except Exception as exc:
            raise _unreadable(field, file, exc) from None
        return [] if batch is None else batch.to_pylist()

    return DatasetHead(names, read)


def _unreadable(field: str, file: Path, exc: Exception) -> ConfigError:
    return ConfigError(f"{field}: {file} cannot be read as Parquet: {str(exc).strip()}", hint=PARQUET_FIX)

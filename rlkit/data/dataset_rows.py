"""The first rows of a JSON Lines dataset, read on the login node (rlkit.data.dataset_head gives a dataset's columns
and first rows for JSON Lines and Parquet alike, for the column checks); and that a Parquet dataset is whole
Parquet."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.errors import ConfigError

LINE_LIMIT = 64 * 2**20  # characters: a row longer than this is no prompt (a file of one endless line, /dev/zero)


def first_jsonl_rows(field: str, path: Path, count: int) -> list[Any] | None:
    """Up to `count` rows (JSON values, one per non-blank line) from the start of a .jsonl file or of the first .jsonl
    file of a directory (None for other formats: those are checked in the job); ConfigError naming `field` for an
    unreadable, empty or non-JSON file."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or files[0].suffix != ".jsonl":
        return None
    if files[0].exists() and not files[0].is_file():  # a FIFO would block the submit, /dev/zero never end
        raise ConfigError(f"{field}: {files[0]} is not a regular file", hint="give a .jsonl file")
    rows: list[Any] = []
    try:
        with open(files[0]) as f:
            for number, line in enumerate(iter(lambda: f.readline(LINE_LIMIT + 1), ""), 1):
                if len(line) > LINE_LIMIT:
                    raise ConfigError(f"{field}: line {number} of {files[0]} is longer than "
                                      f"{LINE_LIMIT // 2**20} MiB", hint="write one JSON object per line")
                if not line.strip():
                    continue
                try:
                    rows.append(untrusted_json.loads(line))
                except ValueError as exc:
                    where = f"line {number}" if rows else "the first line"
                    raise ConfigError(f"{field}: {where} of {files[0]} is not JSON ({exc})",
                                      hint="write one JSON object per line") from None
                if len(rows) >= count:  # read no further than the rows asked for
                    break
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{field}: {files[0]} cannot be read as text: "
                          f"{getattr(exc, 'strerror', None) or exc}", hint="give a .jsonl file you may read",
                          site=True) from None
    if not rows:
        raise ConfigError(f"{field}: {files[0]} is empty", hint="give a file with at least one row")
    return rows


PARQUET_MAGIC = b"PAR1"  # a Parquet file starts and ends with it; the 4 bytes before the end give the footer's length
PARQUET_FIX = "write it again (pyarrow, pandas or datasets' to_parquet), or copy it again if a copy was cut short"


def parquet_files(path: Path) -> list[Path]:
    """The .parquet files of a dataset: the file itself, or those of a directory in name order."""
    return sorted(path.glob("*.parquet")) if path.is_dir() else [path] if path.suffix == ".parquet" else []


def check_parquet_files(field: str, path: Path) -> None:
    """Every .parquet file of a dataset (a file, or those of a directory) is whole Parquet, its footer (the schema
    and where each column lies) readable; ConfigError naming `field` otherwise. A file of other bytes, or one cut
    short by a copy, failed only in the job, after the queue wait. Reads the ends of each file only: the login node
    needs neither `datasets` nor pyarrow (the job reads rows through them; pyarrow, when here, parses the footer)."""
    files = parquet_files(path)
    for file in files:
        if not file.is_file():  # a FIFO would block the submit
            raise ConfigError(f"{field}: {file} is not a regular file", hint="give a .parquet file")
        try:
            with open(file, "rb") as f:
                size = f.seek(0, 2)
                f.seek(0)
                head = f.read(4)
                f.seek(max(size - 8, 0))
                tail = f.read(8)
        except OSError as exc:
            raise ConfigError(f"{field}: {file} cannot be read: {exc.strerror or exc}",
                              hint="give a .parquet file you may read", site=True) from None
        if head != PARQUET_MAGIC:
            raise ConfigError(f"{field}: {file} is not a Parquet file (it does not start with Parquet's "
                              f"{PARQUET_MAGIC.decode()} marker)", hint=PARQUET_FIX)
        if size < 12 or tail[4:] != PARQUET_MAGIC or struct.unpack("<I", tail[:4])[0] > size - 12:
            raise ConfigError(f"{field}: {file} is cut short or damaged (its {size} bytes do not end with a "
                              f"Parquet footer)", hint=PARQUET_FIX)
        _parse_footer(field, file)


def _parse_footer(field: str, file: Path) -> None:
    """The footer parsed by pyarrow, the reader `datasets` uses, when it is installed here."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return
    try:
        pq.read_metadata(file)
    except Exception as exc:  # pyarrow's ArrowInvalid/OSError for a damaged footer: its words, not a traceback
        raise ConfigError(f"{field}: {file} cannot be read as Parquet: {str(exc).strip()}",
                          hint=PARQUET_FIX) from None

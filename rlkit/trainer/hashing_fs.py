"""torch.distributed.checkpoint storage that checksums every file while it is written, so sealing a recover
checkpoint needs no second pass over its bytes (xxh3-128, the checksum `rlkit.trainer.recover` keeps in its manifest).

Only a file written front to back is recorded; one that was seeked in is left out and `recover.seal` hashes it from
the page cache instead, so a digest is never wrong, at worst computed later. Reading is not hashed here: DCP reads
the items of a file in no particular order (and maybe not all of them), so `recover.verify` checks a checkpoint
in one pass before it is loaded.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

Digests = dict[str, tuple[int, str]]  # file path (as written) -> (size, xxh3-128 hex digest)


class _HashingStream(io.IOBase):
    """A binary file that feeds every byte written to xxh3-128 on the way to the disk."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw
        self.digest = xxhash.xxh3_128()
        self.size = 0
        self.sequential = True  # False once anything moved the position: the digest is then not used

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        try:
            view = memoryview(data).cast("B")
        except (TypeError, ValueError):  # not a flat buffer: write it, leave this file to seal's hashing
            self.sequential = False
            return int(self.raw.write(data))
        self.digest.update(view)
        self.size += len(view)
        written = self.raw.write(view)
        if written != len(view):
            self.sequential = False
        return int(written)

    def tell(self) -> int:
        return int(self.raw.tell())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.sequential = False
        return int(self.raw.seek(offset, whence))

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes
            self.raw.close()


class HashingFileSystem(FileSystem):
    """DCP's local filesystem, plus the size and xxh3-128 of every file written front to back (`digests`)."""

    def __init__(self) -> None:
        self.digests: Digests = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = _HashingStream(raw)
            yield stream
        if stream.sequential:
            self.digests[str(Path(path))] = (stream.size, stream.digest.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        digest = self.digests.pop(str(Path(path)), None)
        if digest is not None:
            self.digests[str(Path(new_path))] = digest


def hashing_writer(path: Path) -> tuple[FileSystemWriter, HashingFileSystem]:
    """A DCP writer for `path` whose files are checksummed as they are written; the digests fill in the second."""
    writer = FileSystemWriter(str(path))
    fs = HashingFileSystem()
    writer.fs = fs
    return writer, fs

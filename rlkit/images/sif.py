"""Read what a SIF file (Apptainer's image format) says about itself without Apptainer: header, data objects, the
definition file it was built from, and that file's %labels.

The login node that renders a job often has no Apptainer, and `apptainer inspect` needs it. The SIF layout is
small and stable (sylabs/sif, spec version 01, little-endian, no padding): a 128-byte global header, a table of
585-byte descriptors, and data objects, one of which (type Def.FILE) is the definition file `apptainer build`
embeds. The labels a definition declares are read from there.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"SIF_MAGIC\0"
HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")  # launch, magic, version, arch, uuid, ctime, mtime, free, total,
#                                                    descriptors offset, descriptors size, data offset, data size
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")  # type, used, id, group, link, offset, size, padded size,
#                                                      ctime, mtime, uid, gid, name, extra
DEFFILE_TYPE = 0x4001
PARTITION_TYPE = 0x4004
MAX_DEFFILE_BYTES = 1 << 20  # a definition file is text of a few KB; more is not a definition file


class SifError(Exception):
    """The file is not a SIF image this reader understands; the message says what is wrong."""


@dataclass(frozen=True)
class DataObject:
    kind: int
    offset: int
    size: int


@dataclass(frozen=True)
class SifImage:
    """`deffile`: the embedded definition file (None when the image has none, e.g. pulled from a registry)."""

    version: str
    arch: str
    objects: tuple[DataObject, ...]
    deffile: str | None

    @property
    def has_partition(self) -> bool:
        return any(obj.kind == PARTITION_TYPE for obj in self.objects)


def read_sif(path: Path) -> SifImage:
    """Header, descriptors and definition file of the image at `path` (reads a few KB, whatever the image's size)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size or head[32:42] != MAGIC:
            raise SifError("not a SIF image (no SIF_MAGIC in its header): an Apptainer image is built with "
                           "`apptainer build` (a sandbox directory, a Docker archive or a squashfs is not one)")
        fields = HEADER.unpack(head)
        version, arch = _text(fields[2]), _text(fields[3])
        total, descr_offset = fields[8], fields[9]
        if version != "01":
            raise SifError(f"SIF spec version {version!r}; this reader knows version 01")
        if not 0 < total <= 4096 or descr_offset + total * DESCRIPTOR.size > size:
            raise SifError(f"a damaged SIF header ({total} descriptors at byte {descr_offset} of a {size}-byte file)")
        f.seek(descr_offset)
        table = f.read(total * DESCRIPTOR.size)
        objects = []
        for i in range(total):
            kind, used, _id, _group, _link, offset, length, *_rest = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
            if used:
                if offset < 0 or length < 0 or offset + length > size:
                    raise SifError(f"descriptor {i} points outside the file (bytes {offset}+{length} of {size})")
                objects.append(DataObject(kind, offset, length))
        deffile = None
        for obj in objects:
            if obj.kind == DEFFILE_TYPE and obj.size <= MAX_DEFFILE_BYTES:
                f.seek(obj.offset)
                deffile = f.read(obj.size).decode("utf-8", "replace")
                break
    return SifImage(version, arch, tuple(objects), deffile)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def deffile_labels(deffile: str) -> dict[str, str]:
    """The `%labels` section of a definition file: one `KEY VALUE` per line (Apptainer's own format)."""
    labels: dict[str, str] = {}
    in_labels = False
    for raw in deffile.splitlines():
        line = raw.strip()
        if line.startswith("%"):
            in_labels = line.split()[0] == "%labels"
        elif in_labels and line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            labels[key] = value.strip()
    return labels


def sha256_record(image: Path) -> Path:
    """Where `rlkit image check --sha256` leaves an image's digest, so later submits record it without reading GBs."""
    return image.with_name(image.name + ".sha256")


def recorded_sha256(image: Path) -> str | None:
    """The recorded digest when it is not older than the image and looks like one (anyone could write the file:
    it is recorded in the manifest as a fact about the image, never trusted to decide anything)."""
    record = sha256_record(image)
    try:
        if record.stat().st_mtime < image.stat().st_mtime:
            return None
        text = record.read_text(errors="replace")[:200].split()
    except OSError:
        return None
    return text[0] if text and re.fullmatch(r"[0-9a-f]{64}", text[0]) else None

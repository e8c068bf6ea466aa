"""Delta pushes, trainer side (`actor.weight_update_delta`; the wire format and the receivers' copy:
rlkit.servers.weight_delta): trainer rank 0 keeps what it last pushed (the wire dtype, on the CPU: one model's
bytes) and which servers confirmed it, and makes each push a delta against it when every server of the push holds
it, else a full push (the first push of a trainer, a server restarted, added or failed last time).

Used by both transports: disk writes a delta as one file (`write_delta`), broadcast sends the encoded buckets.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rlkit.fsutil import write_dir
from rlkit.servers.backend import Server
from rlkit.servers.weight_delta import DELTA_FILE, DeltaHeader, encode
from rlkit.weights.xccl_group import Key, key

if TYPE_CHECKING:
    import torch

    from rlkit.weights.base import ServerOutcome


class DeltaEncoder:
    """Rank 0's last push and its holders. Per push: `header(servers)` -> `encode_bucket` for every bucket ->
    `complete()` -> `settle(outcomes)` (-> `describe` for the log). Servers are known by index and address, as the
    broadcast groups know them (a restarted server comes back under a new address)."""

    def __init__(self, dtype: torch.dtype | None, skip: Iterable[str] = ()) -> None:
        self.dtype = dtype  # the wire dtype (None: as gathered)
        self.skip = frozenset(skip)  # tied aliases: never sent, the servers tie them
        self._run = secrets.token_hex(4)  # a restarted trainer's ids never match an earlier one's
        self._pushes = 0
        self._last: dict[str, torch.Tensor] = {}
        self._last_id: str | None = None
        self._holders: set[Key] = set()
        self._current: DeltaHeader | None = None

    def header(self, servers: Sequence[Server]) -> DeltaHeader:
        """The next push's header: a delta against the last push when every one of `servers` holds it, else full."""
        self._pushes += 1
        holds = self._last_id is not None and bool(servers) and all(key(s) in self._holders for s in servers)
        self._current = DeltaHeader(f"{self._run}-p{self._pushes}", self._last_id if holds else None)
        self._last_id, self._holders = None, set()  # the copy changes from now on: of no push until complete()
        return self._current

    def encode_bucket(self, bucket: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The bucket as it travels in the current push (whole tensors in a full push); the copy takes its tensors."""
        if self._current is None:
            raise RuntimeError("DeltaEncoder.header() first")
        delta = self._current.base is not None
        out: dict[str, torch.Tensor] = {}
        for name, tensor in bucket.items():
            if name in self.skip:
                continue
            new = tensor.detach().to("cpu", self.dtype).contiguous()
            if new.data_ptr() == tensor.data_ptr():  # the trainer's own storage: it changes at the next step
                new = new.clone()
            out.update(encode(name, new, self._last.get(name)) if delta else {name: new})
            self._last[name] = new
        return out

    def encoded(self, buckets: Iterable[Mapping[str, torch.Tensor] | None]) -> Iterator[dict[str, torch.Tensor] | None]:
        """`encode_bucket` over a bucket iterator (None passes through); `complete()` when it ends."""
        for bucket in buckets:
            yield None if bucket is None else self.encode_bucket(bucket)
        self.complete()

    def complete(self) -> None:
        """Every tensor of the current push went through `encode_bucket`: the copy is of that push."""
        assert self._current is not None
        self._last_id = self._current.id

    def settle(self, outcomes: Iterable[ServerOutcome]) -> None:
        """The servers the push reached hold it (a delta may go to them next)."""
        if self._last_id is not None:
            self._holders = {key(o.server) for o in outcomes if o.sync is not None}

    def describe(self, version: int, sent_bytes: int) -> str:
        """The trainer log's line for the current push."""
        header = self._current
        assert header is not None
        kind = f"a delta against push {header.base}" if header.base else "a full push (the servers keep a copy)"
        return (f"rlkit train: weight version {version} went out as {kind}: push {header.id}, "
                f"{sent_bytes / 1e6:.3f} MB")


def write_delta(tensors: Mapping[str, torch.Tensor], out_dir: Path, header: DeltaHeader) -> Path:
    """A delta push by disk: `out_dir/rlkit-delta.safetensors` (its header in the file's metadata), written as
    `write_weights` writes a version (`rlkit.fsutil.write_dir`: no server sees a part of it)."""
    from safetensors.torch import save_file

    def fill(tmp: Path) -> None:
        save_file(dict(tensors), str(tmp / DELTA_FILE), metadata={"id": header.id, "base": header.base or ""})

    return write_dir(out_dir, fill)

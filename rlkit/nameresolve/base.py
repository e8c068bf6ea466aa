"""The name-resolve interface: a small key -> value store that in-job steps use to find each other.

Inference servers register ``servers/<index>`` -> JSON (address, backend, model, weight version) and the
trainer/client discovers them. Keys are '/'-separated relative paths; values are strings returned exactly as
stored. An entry added with ``keepalive=True`` lives only while its owner's heartbeat runs: readers treat it as
gone once its heartbeat is older than the reader's ``ttl``, so a dead server is never handed out.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from types import TracebackType
from typing import TypeVar

from rlkit.errors import StepError


class NameResolveError(Exception):
    """Base class of the name-resolve errors."""


class NameEntryNotFoundError(NameResolveError, KeyError):
    """The key has no live entry (never added, deleted, or its keepalive owner stopped heartbeating)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class NameEntryExistsError(NameResolveError):
    """``add(..., replace=False)`` found a live entry under the key."""


class NameResolveTimeoutError(NameResolveError, StepError):
    """``wait`` gave up: the message names the key, where it was looked for and the timeout."""


_NR = TypeVar("_NR", bound="NameResolve")


def check_component(what: str, name: str) -> str:
    """An experiment or trial name used as one path component."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"{what} must be one non-empty path component without '/', got {name!r}")
    return name


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid relative '/'-separated key, else raise ValueError."""
    if not isinstance(key, str):
        raise ValueError(f"name-resolve key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("name-resolve key must not be empty")
    if key.startswith("/"):
        raise ValueError(f"name-resolve key {key!r} must be relative (no leading '/')")
    if "\x00" in key:
        raise ValueError(f"name-resolve key {key!r} must not contain NUL")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"name-resolve key {key!r} has an empty, '.' or '..' component")
    return key


def normalize_prefix(prefix: str) -> str:
    """Validate a subtree prefix and strip a trailing '/'; '' means the whole store."""
    if not isinstance(prefix, str):
        raise ValueError(f"name-resolve prefix must be a str, got {type(prefix).__name__}")
    if not prefix:
        return ""
    return validate_key(prefix[:-1] if prefix.endswith("/") and len(prefix) > 1 else prefix)


def key_in_subtree(key: str, prefix: str) -> bool:
    """True if ``key`` is ``prefix`` or lies below it as a path ('servers' matches 'servers/0', not 'serversX')."""
    return not prefix or key == prefix or key.startswith(prefix + "/")


class NameResolve(ABC):
    """A key -> value store shared by the steps of one experiment trial."""

    @abstractmethod
    def add(self, key: str, value: str, *, replace: bool = False, keepalive: bool = False) -> None:
        """Store ``value`` under ``key``; raise NameEntryExistsError if a live entry exists and not ``replace``.

        With ``keepalive=True`` this process heartbeats the entry until ``close``/``delete``; without it the entry
        never expires.
        """

    @abstractmethod
    def get(self, key: str) -> str:
        """Return the live value of ``key`` or raise NameEntryNotFoundError."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; raise NameEntryNotFoundError if there is nothing to remove."""

    @abstractmethod
    def list_subtree(self, prefix: str) -> dict[str, str]:
        """All live entries at or below ``prefix`` (as a path), key -> value, sorted by key."""

    @abstractmethod
    def clear_subtree(self, prefix: str) -> None:
        """Remove every entry at or below ``prefix``; no error if there is none."""

    @abstractmethod
    def close(self) -> None:
        """Stop heartbeats and remove this instance's keepalive entries. Idempotent."""

    def describe_location(self) -> str:
        """Where entries live, for error messages (a directory, an etcd prefix...)."""
        return type(self).__name__

    def describe_entry(self, key: str) -> str:
        """Where the entry of ``key`` lives, for warnings about it (a file, an etcd key...)."""
        return f"entry {key!r} in {self.describe_location()}"

    def diagnose(self, key: str) -> str:
        """Extra detail on why ``key`` is not live (e.g. a stale entry's owner), or ''."""
        return ""

    def wait(self, key: str, timeout: float, poll: float = 0.2) -> str:
        """Poll until ``key`` has a live entry and return its value; raise NameResolveTimeoutError after ``timeout``."""
        validate_key(key)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get(key)
            except NameEntryNotFoundError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(poll, remaining))
        detail = self.diagnose(key)
        raise NameResolveTimeoutError(
            f"timed out after {timeout:g} s waiting for name-resolve key {key!r} in {self.describe_location()}"
            + (f"; {detail}" if detail else "")
            + "; is the step that registers it running, and does it use the same record root, experiment and trial?"
        )

    def __enter__(self: _NR) -> _NR:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

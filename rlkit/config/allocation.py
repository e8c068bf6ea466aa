"""The `allocation_mode` grammar: which GPUs serve and which train.

    allocation_mode := server [ "+" trainer ] | trainer
    server          := ("vllm" | "sglang") (":" | ".") dims   d (replicas), t (tensor parallel)
    trainer         := [ "fsdp" (":" | ".") ] dims            d (data-parallel ranks); no prefix: fsdp
    dims            := (letter integer)+                      each letter at most once; missing letters are 1

Examples: `vllm:d2` (two 1-GPU servers), `sglang:d4t2+fsdp:d8` (four 2-GPU servers and eight trainer GPUs),
`fsdp:d2` (a trainer-only job on two GPUs). `+` means separate GPUs: servers and trainer never share a GPU.

AReaL's earlier forms read the same: `sglang.d4p1t1+d4p1t1` (2025) and `sglang:d4p1t1+d4p1t1` (a trainer part
without a backend). Its letters p (pipeline), e (expert) and c (context parallel) are accepted at 1, which is what
rlkit does; larger values are refused with the reason, as are trainer t and AReaL's other trainer backends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from rlkit.errors import ConfigError, ConfigErrors

# The inference engines rlkit runs: the one list (rlkit.servers.backend's registry is built from it, one package
# rlkit.servers.<name> per engine).
ServerBackendName = Literal["vllm", "sglang"]
SERVER_BACKENDS: tuple[ServerBackendName, ...] = get_args(ServerBackendName)
TRAINER_BACKENDS = ("fsdp",)
_ALLOWED_DIMS: dict[str, str] = {**dict.fromkeys(SERVER_BACKENDS, "dt"), "fsdp": "d"}
_AT_ONE = {  # AReaL's letters rlkit accepts only at 1, and why
    "p": "pipeline parallelism (p) is not supported",
    "e": "expert parallelism (e) is not supported",
    "c": "context parallelism (c) is not supported",
    "t": "the FSDP trainer shards over its d ranks only (no tensor parallelism, t)",
}
_OTHER_TRAINERS = ("megatron", "archon")  # AReaL's; rlkit trains with FSDP2
_PART = re.compile(r"^(?:(?P<backend>[a-z]+)[:.])?(?P<dims>(?:[a-z]\d+)+)$")
_DIM = re.compile(r"([a-z])(\d+)")
_EXAMPLE = "e.g. vllm:d2t2+fsdp:d4, vllm:d2 or fsdp:d2"


@dataclass(frozen=True)
class ServerAllocation:
    """Inference servers: `dp` replicas of `tp` GPUs each."""

    backend: str
    dp: int
    tp: int

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


@dataclass(frozen=True)
class TrainerAllocation:
    """The trainer: `dp` ranks, one GPU each."""

    backend: str
    dp: int

    @property
    def gpus(self) -> int:
        return self.dp


@dataclass(frozen=True)
class Allocation:
    """A parsed allocation_mode."""

    server: ServerAllocation | None
    trainer: TrainerAllocation | None


def _fail(mode: str, why: str) -> ConfigError:
    return ConfigError(f"allocation_mode '{mode}': {why}",
                       hint=f"use the form backend:dims[+fsdp:dims] or fsdp:dims, {_EXAMPLE}")


def _parse_part(mode: str, part: str, problems: list[ConfigError]) -> tuple[str, dict[str, int]] | None:
    """One `backend:dims` part; every mistake in it goes to `problems` (None when it cannot be read)."""
    match = _PART.match(part.strip())
    if not match:
        problems.append(_fail(mode, f"'{part}' is not backend:dims"))
        return None
    backend = match["backend"] or "fsdp"
    if backend in _OTHER_TRAINERS:
        problems.append(_fail(mode, f"trainer backend '{backend}' is not supported: rlkit trains with FSDP2"))
        return None
    if backend not in _ALLOWED_DIMS:
        known = ", ".join((*SERVER_BACKENDS, *TRAINER_BACKENDS))
        problems.append(_fail(mode, f"unknown backend '{backend}' (known: {known})"))
        return None
    dims: dict[str, int] = {}
    found = len(problems)
    for letter, number in _DIM.findall(match["dims"]):
        if letter in dims:
            problems.append(_fail(mode, f"'{letter}' given twice in '{part}'"))
        elif letter in _AT_ONE and letter not in _ALLOWED_DIMS[backend]:
            if int(number) != 1:
                problems.append(_fail(mode, f"'{letter}{number}' in '{part}': {_AT_ONE[letter]}"))
        elif letter not in _ALLOWED_DIMS[backend]:
            problems.append(_fail(mode, f"{backend} takes only {', '.join(_ALLOWED_DIMS[backend])} (got '{letter}')"))
        elif int(number) < 1:
            problems.append(_fail(mode, f"'{letter}{number}' must be at least 1"))
        dims.setdefault(letter, int(number))
    return (backend, dims) if len(problems) == found else None


def parse_allocation(mode: str) -> Allocation:
    """Parse allocation_mode (the one place it is read on the login node); raises ConfigError, or ConfigErrors
    listing every mistake when there are several."""
    parts = [p for p in mode.replace(" ", "").split("+")]
    if not mode.strip() or any(not p for p in parts) or len(parts) > 2:
        raise _fail(mode, "expected one server part, optionally '+' one trainer part (or a trainer part alone)")
    problems: list[ConfigError] = []
    server: ServerAllocation | None = None
    trainer: TrainerAllocation | None = None
    for part in parts:
        parsed = _parse_part(mode, part, problems)
        if parsed is None:
            continue
        backend, dims = parsed
        if backend in SERVER_BACKENDS:
            if server is not None:
                problems.append(_fail(mode, "more than one server part"))
            server = ServerAllocation(backend, dims.get("d", 1), dims.get("t", 1))
        else:
            if trainer is not None:
                problems.append(_fail(mode, "more than one trainer part"))
            trainer = TrainerAllocation(backend, dims.get("d", 1))
    if server is not None and trainer is not None and not parts[0].startswith(SERVER_BACKENDS):
        problems.append(_fail(mode, "put the server part first"))
    if len(problems) > 1:
        raise ConfigErrors(problems)
    if problems:
        raise problems[0]
    return Allocation(server=server, trainer=trainer)


def canonical_mode(allocation: Allocation) -> str:
    """The one form rlkit writes: `backend:dN[tN]` parts joined by `+` (missing letters left out when 1)."""
    parts = []
    if allocation.server is not None:
        s = allocation.server
        parts.append(f"{s.backend}:d{s.dp}" + (f"t{s.tp}" if s.tp > 1 else ""))
    if allocation.trainer is not None:
        parts.append(f"{allocation.trainer.backend}:d{allocation.trainer.dp}")
    return "+".join(parts)

"""Slurm time limits, parsed and normalised by rlkit (not left to YAML or to sbatch's guesswork).

Slurm reads `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` and `D-HH:MM:SS` (and UNLIMITED/INFINITE). rlkit reads the
same forms, refuses anything else before submitting, and renders one form, `D-HH:MM:SS`, so the script says exactly
what the user meant.
"""

from __future__ import annotations

import re

UNLIMITED = ("UNLIMITED", "INFINITE")
_PLAIN = re.compile(r"(\d+)(?::(\d+))?(?::(\d+))?")  # MM, MM:SS, HH:MM:SS
_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")  # D-HH, D-HH:MM, D-HH:MM:SS


def slurm_time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit; None for unlimited; ValueError for anything Slurm would not read that way."""
    if text.upper() in UNLIMITED:
        return None
    if plain := _PLAIN.fullmatch(text):
        parts = [int(p) for p in plain.groups() if p is not None]
        if len(parts) == 1:
            return parts[0] * 60
        if len(parts) == 2:
            minutes, seconds = parts
            _check_below(text, seconds, 60)
            return minutes * 60 + seconds
        hours, minutes, seconds = parts
        _check_below(text, minutes, 60)
        _check_below(text, seconds, 60)
        return hours * 3600 + minutes * 60 + seconds
    if days := _DAYS.fullmatch(text):
        d, h, m, s = (int(p) if p is not None else 0 for p in days.groups())
        _check_below(text, h, 24)
        _check_below(text, m, 60)
        _check_below(text, s, 60)
        return ((d * 24 + h) * 60 + m) * 60 + s
    raise ValueError(f"'{text}' is not a Slurm time")


def _check_below(text: str, value: int, limit: int) -> None:
    if value >= limit:
        raise ValueError(f"'{text}' is not a Slurm time ({value} is not below {limit})")


def format_slurm_time(seconds: int | None) -> str:
    """`D-HH:MM:SS`, the one form rlkit renders (UNLIMITED for None)."""
    if seconds is None:
        return "UNLIMITED"
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    d, h = divmod(hours, 24)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}"

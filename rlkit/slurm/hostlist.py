"""Slurm hostlists (`gpu[01-03,07],login1`) expanded to host names (pure)."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"([^,\[]*)(\[[^\]]*\])?([^,\[]*)")


def _expand_range(body: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"'[{body}]' is not a range list like [1-4,7]")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range '{part}' goes backwards")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """`node[1-3],gpu07` -> ['node1', 'node2', 'node3', 'gpu07']; raises ValueError on malformed input."""
    hosts: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise ValueError(f"cannot read a host name at '{text[pos:]}'")
        prefix, bracket, suffix = match.groups()
        if bracket:
            hosts.extend(f"{prefix}{n}{suffix}" for n in _expand_range(bracket[1:-1]))
        elif prefix or suffix:
            hosts.append(prefix + suffix)
        else:
            raise ValueError("empty host name")
        pos = match.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"unexpected '{text[pos]}'")
            pos += 1
    if len(set(hosts)) != len(hosts):
        raise ValueError("a host is listed twice")
    return hosts

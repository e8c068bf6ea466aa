"""Collecting every problem of a configuration before reporting any: a user fixes all of them in one edit.

Checks are written as plain functions that raise ConfigError; `Problems.check()` runs one such block and keeps its
error instead of stopping, so independent checks each get their say and dependent ones can ask `ok()` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from rlkit.errors import ConfigError, ConfigErrors


class Problems:
    """The problems found so far, in the order found."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []
        self.notes: list[str] = []  # said as warnings, the config accepted (a knob of a server nothing runs)

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run one independent check: a ConfigError raised inside is recorded, not propagated."""
        try:
            yield
        except ConfigErrors as many:
            for error in many.errors:
                self._record(error)
        except ConfigError as exc:
            self._record(exc)

    def add(self, message: str, *, hint: str | None = None, site: bool = False, recorded_ok: str = "") -> None:
        self._record(ConfigError(message, hint=hint, site=site, recorded_ok=recorded_ok))

    def note(self, message: str) -> None:
        """Keep `message` to be said as a warning: not a problem, the config stands."""
        if message not in self.notes:
            self.notes.append(message)

    def _record(self, error: ConfigError) -> None:
        """Keep `error` unless the same problem is already recorded (two checks may share a field, e.g. the model
        the servers and the trainer both load)."""
        if not any(str(e) == str(error) and e.hint == error.hint for e in self.errors):
            self.errors.append(error)

    def ok(self) -> bool:
        return not self.errors

    def site_warnings(self) -> list[ConfigError]:
        """Problems with the site's files only (what a dry run may tolerate)."""
        return [e for e in self.errors if e.site]

    def take_recorded_ok(self) -> list[ConfigError]:
        """Remove and return the problems a recorded trial may keep on resume (ConfigError.recorded_ok)."""
        kept = [e for e in self.errors if e.recorded_ok]
        self.errors = [e for e in self.errors if not e.recorded_ok]
        return kept

    def raise_if_any(self, *, allow_site: bool = False) -> None:
        """Raise every problem (site-file problems too, unless `allow_site`): one ConfigError, or ConfigErrors."""
        errors = [e for e in self.errors if not (allow_site and e.site)]
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ConfigErrors(errors)


_MISSING_ENV = re.compile(r"Environment variable '([^']+)' not found")
_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")


def refuse_inert_fields(problems: Problems, section: Any, prefix: str, *, because: str, hint: str,
                        names: Sequence[str] | None = None) -> None:
    """Each field of the dataclass `section` (or only `names`) set away from its default, refused: under the setting
    `because` names, rlkit would ignore it without a word. `hint` may name the field as {field}."""
    defaults = type(section)()
    for name in names if names is not None else [f.name for f in fields(section)]:
        if getattr(section, name) != getattr(defaults, name):
            problems.add(f"{prefix}.{name} is set, but {because}: it would be ignored",
                         hint=hint.format(field=f"{prefix}.{name}"))


def interpolation_fix(detail: str) -> str:
    """The fix for a `${...}` that did not resolve, by its cause: an unset environment variable, or a name that is
    no key of the config."""
    env = _MISSING_ENV.search(detail)
    if env:
        return f"export {env[1]} before running rlkit, or give it a default: ${{oc.env:{env[1]},<default>}}"
    key = _MISSING_KEY.search(detail)
    if key:
        return f"'{key[1]}' is no key of this config: set it, or write the value in place of the ${{{key[1]}}}"
    return "check the ${...} reference: a key of the config, or ${oc.env:VAR} for an environment variable"

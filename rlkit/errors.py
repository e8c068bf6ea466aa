"""Errors that reach the user as one clear message and exit code 2 (a user mistake) or 1 (a failure)."""

from __future__ import annotations

from rlkit.step_contract import NO_RETRY_EXIT as NO_RETRY_EXIT  # the code FatalStepError exits with


class UserError(Exception):
    """A mistake in the user's input: printed as one message, exit code 2, nothing changed on disk or in Slurm."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class ConfigError(UserError):
    """The configuration (YAML or override) is invalid. `site`: the problem is a missing or unusable file of the
    site (image, model, dataset, fileroot), which `rlkit render` reports as a warning and `submit` refuses.
    `recorded_ok`: the field of a value an older rlkit accepted and ignored (a knob the job type never reads),
    which a trial recorded with it keeps on `rlkit resume` (a warning there; refused at submit, and when the
    resume's own overrides give it); "" for any other problem."""

    def __init__(self, message: str, *, hint: str | None = None, site: bool = False,
                 recorded_ok: str = "") -> None:
        super().__init__(message, hint=hint)
        self.site = site
        self.recorded_ok = recorded_ok


class ConfigErrors(ConfigError):
    """Every problem found in one configuration, reported together (one line each, then exit 2)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__("\n".join(str(e) for e in errors), site=all(e.site for e in errors))
        self.errors = errors


def each_error(exc: UserError) -> list[UserError]:
    """The single problems inside `exc` (itself, unless it collects several)."""
    return list(exc.errors) if isinstance(exc, ConfigErrors) else [exc]


class SlurmError(Exception):
    """A Slurm command failed for a reason outside the user's input (exit code 1)."""

    exit_code = 1


class StepError(Exception):
    """An in-job step could not do its work (exit code 1); the message says what was being waited for or done."""

    exit_code = 1




class FatalStepError(StepError):
    """A step failure that restarting the step in the same job cannot fix (a server whose guard is open, refused
    extra_args): exit code `NO_RETRY_EXIT`, so the job fails at once instead of retrying the same mistake."""

    exit_code = NO_RETRY_EXIT


DISK_FULL_ERRNOS = (28, 122)  # ENOSPC, EDQUOT (Linux)
DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded")


def disk_full(exc: BaseException) -> str | None:
    """What filled up, when `exc` (or an exception it was raised from, or one whose text it carries, as
    torch.distributed.checkpoint's do for every rank) is ENOSPC or EDQUOT; else None. A full disk is no transient
    failure: retrying the step would fill it again, so it is named and not retried."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            where = f" writing {current.filename}" if current.filename else ""
            return f"the disk is full ({current.strerror}){where}"
        text = str(current)
        for words in DISK_FULL_WORDS:
            if words in text:
                return f"the disk is full ({words}): {text[:300]}"
        current = current.__cause__ or current.__context__
    return None

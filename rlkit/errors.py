"""Errors that reach the user as one clear message and exit code 2 (a user mistake) or 1 (a failure)."""

from __future__ import annotations


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
    """The configuration (YAML or override) is invalid."""


class SlurmError(Exception):
    """A Slurm command failed for a reason outside the user's input (exit code 1)."""

    exit_code = 1


class StepError(Exception):
    """An in-job step could not do its work (exit code 1); the message says what was being waited for or done."""

    exit_code = 1


# sysexits' EX_CONFIG; the batch script's supervisor (rlkit.launch.render) never restarts a step that exits with it
NO_RETRY_EXIT = 78


class FatalStepError(StepError):
    """A step failure that restarting the step in the same job cannot fix (a server whose guard is open, refused
    extra_args): exit code `NO_RETRY_EXIT`, so the job fails at once instead of retrying the same mistake."""

    exit_code = NO_RETRY_EXIT

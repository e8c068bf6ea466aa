"""Submit-time checks of the minimum completion length (`gconfig.min_new_tokens`, `eval_gconfig.min_new_tokens`).

The servers are told it per request (vLLM's `min_tokens`, SGLang's `min_new_tokens`): a value they would refuse, or
one above the request's `max_new_tokens`, would fail every request minutes into the job, so it is refused here.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.schema import ExperimentConfig


def _is_count(value: Any) -> bool:
    """A whole number (YAML's true/false are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_value(name: str, value: Any, problems: Problems, *, inherit: str = "") -> bool:
    """`value` is a count >= 0; False (and a problem) otherwise."""
    other = f", or null for {inherit}" if inherit else ""
    if not _is_count(value):
        problems.add(f"{name} must be a whole number of tokens (got {value!r})",
                     hint=f"e.g. {name}=8, or {name}=0 for no minimum{other}")
        return False
    if value < 0:
        problems.add(f"{name} must be >= 0 (got {value}; 0 is no minimum)",
                     hint=f"e.g. {name}=8, or {name}=0{other}")
        return False
    return True


def _check_bound(value: int, most: Any, problems: Problems, *, what: str, fix: str) -> None:
    """`what` names the minimum (its value) and the maximum it exceeds; `fix` may name the bound as {most}."""
    if _is_count(most) and value > most:
        problems.add(f"{what}: completions end at {most} tokens, short of the minimum",
                     hint=fix.format(most=most))


def validate_min_new_tokens(config: ExperimentConfig, problems: Problems) -> None:
    """gconfig.min_new_tokens: a count, 0 .. gconfig.max_new_tokens."""
    g = config.gconfig
    if _check_value("gconfig.min_new_tokens", g.min_new_tokens, problems):
        _check_bound(g.min_new_tokens, g.max_new_tokens, problems,
                     what=f"gconfig.min_new_tokens ({g.min_new_tokens}) exceeds gconfig.max_new_tokens "
                          f"({g.max_new_tokens})",
                     fix="lower gconfig.min_new_tokens to at most {most}, or raise gconfig.max_new_tokens")


def validate_eval_min_new_tokens(config: ExperimentConfig, problems: Problems) -> None:
    """eval_gconfig.min_new_tokens (None: gconfig's): a count, at most the evaluation's max_new_tokens (its own or
    gconfig's). A bound broken by gconfig's two values alone is gconfig's problem, reported once by its check."""
    g, e = config.gconfig, config.eval_gconfig
    if e.min_new_tokens is None:
        if e.max_new_tokens is not None and _is_count(g.min_new_tokens):  # else: gconfig's check reports it
            _check_bound(g.min_new_tokens, e.max_new_tokens, problems,
                         what=f"eval_gconfig takes gconfig.min_new_tokens ({g.min_new_tokens}), which exceeds "
                              f"eval_gconfig.max_new_tokens ({e.max_new_tokens})",
                         fix="set eval_gconfig.min_new_tokens to at most {most}, or raise eval_gconfig.max_new_tokens")
        return
    if not _check_value("eval_gconfig.min_new_tokens", e.min_new_tokens, problems, inherit="gconfig.min_new_tokens"):
        return
    if e.max_new_tokens is None:
        _check_bound(e.min_new_tokens, g.max_new_tokens, problems,
                     what=f"eval_gconfig.min_new_tokens ({e.min_new_tokens}) exceeds gconfig.max_new_tokens "
                          f"({g.max_new_tokens}), which eval_gconfig takes",
                     fix="lower eval_gconfig.min_new_tokens to at most {most}, or set eval_gconfig.max_new_tokens")
    else:
        _check_bound(e.min_new_tokens, e.max_new_tokens, problems,
                     what=f"eval_gconfig.min_new_tokens ({e.min_new_tokens}) exceeds eval_gconfig.max_new_tokens "
                          f"({e.max_new_tokens})",
                     fix="lower eval_gconfig.min_new_tokens to at most {most}, or raise eval_gconfig.max_new_tokens")

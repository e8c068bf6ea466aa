"""Submit-time checks of the sampling fields: the minimum completion length (`gconfig.min_new_tokens`,
`eval_gconfig.min_new_tokens`), greedy decoding (`gconfig.greedy`, `eval_gconfig.greedy`) and the stop strings
(`gconfig.stop`, `eval_gconfig.stop`).

The servers are told them per request (vLLM's `min_tokens`, SGLang's `min_new_tokens`; greedy as temperature 0,
rlkit.servers.sampling): a value they would refuse, or one above the request's `max_new_tokens`, would fail every
request minutes into the job, so it is refused here; so is greedy decoding of the rollouts a trainer learns from.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig


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


# --- greedy decoding (gconfig.greedy, eval_gconfig.greedy) --------------------------------------------------------

GREEDY_FIX = "set gconfig.greedy=false, or use eval_gconfig.greedy for evaluation"


def validate_greedy(config: ExperimentConfig, problems: Problems, *, trains_on_rollouts: bool) -> None:
    """gconfig.greedy: a bool; true (requests at temperature 0, rlkit.servers.sampling) is refused for a job that
    trains on its rollouts (grpo, ppo) and, elsewhere (generate), with more than one completion per prompt."""
    g = config.gconfig
    if not isinstance(g.greedy, bool):
        problems.add(f"gconfig.greedy must be true or false (got {g.greedy!r})",
                     hint="e.g. gconfig.greedy=true for greedy decoding, or gconfig.greedy=false to sample")
        return
    if not g.greedy:
        return
    if trains_on_rollouts:
        group = config.actor.group_size
        if group > 1:
            problems.add(f"gconfig.greedy is true, but job type {config.type} trains on groups of actor.group_size="
                         f"{group} completions per prompt: greedy decoding makes every completion of a group the "
                         "same, so the group has nothing to compare", hint=GREEDY_FIX)
        else:
            problems.add(f"gconfig.greedy is true, but job type {config.type} trains on its rollouts: they must be "
                         "sampled at gconfig.temperature (> 0), the temperature the trainer takes its log-probs at, "
                         "not decoded greedily", hint=GREEDY_FIX)
    elif _is_count(g.n_samples) and g.n_samples > 1:
        problems.add(f"gconfig.greedy is true with gconfig.n_samples={g.n_samples}: greedy decoding gives one "
                     "completion per prompt, the same every time (and vLLM refuses n > 1 when greedy)",
                     hint="set gconfig.n_samples=1, or gconfig.greedy=false to sample")


def validate_eval_greedy(config: ExperimentConfig, problems: Problems) -> None:
    """eval_gconfig.greedy (None: gconfig's): a bool; greedy evaluation takes one completion per prompt. A problem of
    gconfig's own values alone is reported once, by validate_greedy."""
    g, e = config.gconfig, config.eval_gconfig
    if e.greedy is not None and not isinstance(e.greedy, bool):
        problems.add(f"eval_gconfig.greedy must be true, false or null (got {e.greedy!r})",
                     hint="e.g. eval_gconfig.greedy=true for greedy evaluation, or null for gconfig.greedy")
        return
    greedy = g.greedy if e.greedy is None else e.greedy
    n = g.n_samples if e.n_samples is None else e.n_samples
    if greedy is not True or not _is_count(n) or n <= 1 or (e.greedy is None and e.n_samples is None):
        return
    took = "takes gconfig.greedy (true)" if e.greedy is None else "eval_gconfig.greedy is true"
    count = (f"eval_gconfig.n_samples={n}" if e.n_samples is not None else
             f"gconfig.n_samples={n}, which eval_gconfig takes")
    problems.add(f"the evaluation {took}, with {count}: greedy decoding gives one completion per prompt, the same "
                 "every time (and vLLM refuses n > 1 when greedy)",
                 hint="set eval_gconfig.n_samples=1, or eval_gconfig.greedy=false to sample")


def validate_stop(config: ExperimentConfig, problems: Problems) -> None:
    """gconfig.stop and eval_gconfig.stop hold non-empty strings: vLLM refuses every request whose stop list holds
    an empty one ("stop cannot contain an empty string"), and one matches anywhere. A list, a mapping, a number or a
    boolean as an item is refused when the config is read (rlkit.config.load), so every item here is a string."""
    for name, stops in (("gconfig.stop", config.gconfig.stop), ("eval_gconfig.stop", config.eval_gconfig.stop)):
        for i, stop in enumerate(stops or []):
            if not stop:
                problems.add(f"{name}[{i}] is {stop!r}: a stop string must be a non-empty string",
                             hint=f"remove it from {name}, or write the text that ends a completion, e.g. "
                                  f"{name}=[\"</answer>\"]")

"""A scored generate run's figures (generate.score): mean reward, pass@k and mean@n, per reasoning-gym task and per
function of a reward mix, and the failed and timed-out reward calls; written as summary.json beside the output.

Everything but the call counts is computed from the output's lines themselves (each completion's `reward`, a mix's
`rewards`, a reasoning-gym row's `task`), so anyone can recompute the summary from the file. pass@k is the unbiased
estimator of Chen et al. 2021 (Evaluating Large Language Models Trained on Code): for a prompt with n completions of
which c pass, 1 - C(n-c, k)/C(n, k), averaged over the prompts; a completion passes when its reward is at least
generate.pass_threshold. Torch-free: `rlkit status` reads the summary's headline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from math import comb
from pathlib import Path
from typing import Any

from rlkit.checks.reasoning_gym import REWARD as REASONING_GYM  # reward.fn reasoning_gym, torch-free

SUMMARY_FILE = "summary.json"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k completions drawn without replacement from n, c of them passing,
    passes: 1 - C(n-c, k)/C(n, k) (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_ks(n: int) -> list[int]:
    """The k reported for n completions per prompt: the powers of two up to n, and n."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == n else [*ks, n]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Iterable[Mapping[str, Any]], *, n_samples: int, threshold: float,
              counts: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a scored output's records (its lines, in any order). `counts`: the reward calls as the scorer
    counted them (reward_calls, failed_calls, timed_out_calls, and per function of a mix, functions: {name:
    {weight, failed_calls, timed_out_calls}})."""
    prompts, rewards, per_prompt = 0, [], []
    by_task: dict[str, list[float]] = {}
    by_function: dict[str, list[float]] = {}
    failed_completions = 0
    for record in records:
        prompts += 1
        values = [float(c["reward"]) for c in record["completions"]]
        rewards.extend(values)
        per_prompt.append(values)
        failed_completions += sum("reward_error" in c for c in record["completions"])
        for c in record["completions"]:
            for name, value in (c.get("rewards") or {}).items():
                by_function.setdefault(name, []).append(float(value))
        task = record.get("task")
        if isinstance(task, str):  # the task's own score where a mix blends it with others (as training logs it)
            by_task.setdefault(task, []).extend(float((c.get("rewards") or {}).get(REASONING_GYM, c["reward"]))
                                                for c in record["completions"])
    summary: dict[str, Any] = {
        "prompts": prompts, "completions": len(rewards), "n_samples": n_samples,
        "reward_mean": _mean(rewards),
        "mean_at_n": _mean([m for m in (_mean(v) for v in per_prompt) if m is not None]),
        "pass_threshold": threshold,
        "pass_at_k": {},
        "failed_completions": failed_completions,
        "reward_calls": counts.get("reward_calls", 0),
        "failed_calls": counts.get("failed_calls", 0),
        "timed_out_calls": counts.get("timed_out_calls", 0),
    }
    for k in pass_ks(n_samples):
        scores = [pass_at_k(len(v), sum(r >= threshold for r in v), k) for v in per_prompt if len(v) >= k]
        if scores:
            summary["pass_at_k"][str(k)] = sum(scores) / len(scores)
    if by_task:
        summary["tasks"] = {task: {"completions": len(v), "reward_mean": _mean(v)}
                            for task, v in sorted(by_task.items())}
    functions = counts.get("functions") or {}
    if functions or by_function:
        summary["functions"] = {name: {**dict(functions.get(name, {})), "mean": _mean(by_function.get(name, []))}
                                for name in [*functions, *(n for n in by_function if n not in functions)]}
    return summary


def _figure(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def headline(summary: Mapping[str, Any]) -> str:
    """One line: prompts x completions, mean reward, pass@k, the failed calls (the step's log and `rlkit status`)."""
    passes = summary.get("pass_at_k")
    shown = "  ".join(f"pass@{k} {_figure(v)}" for k, v in passes.items()) if isinstance(passes, dict) else ""
    return (f"{summary.get('prompts')} prompts, {summary.get('completions')} completions: mean reward "
            f"{_figure(summary.get('reward_mean'))}  {shown} (threshold {summary.get('pass_threshold')}); "
            f"{summary.get('failed_calls')} failed and {summary.get('timed_out_calls')} timed-out reward calls")


def describe(summary: Mapping[str, Any]) -> list[str]:
    """The summary as the step's log shows it: the headline, then a line per task and per function of a mix."""
    lines = [headline(summary)]
    for task, figures in (summary.get("tasks") or {}).items():
        lines.append(f"  task {task}: mean {_figure(figures.get('reward_mean'))} over {figures.get('completions')} "
                     "completions")
    for name, figures in (summary.get("functions") or {}).items():
        lines.append(f"  function {name} (weight {figures.get('weight')}): mean {_figure(figures.get('mean'))}, "
                     f"{figures.get('failed_calls')} failed, {figures.get('timed_out_calls')} timed out")
    return lines


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """Write the summary atomically (a reader sees the old file or the new one, never a part)."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "w") as out:
        out.write(json.dumps(summary, indent=2) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)

"""Per-episode agent metrics, and their means over a batch, under `agent/` (issue 12's metrics list; the
evaluator's episodes under `eval/agent/`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rlkit.agent.episode import Episode


def episode_metrics(episode: Episode) -> dict[str, float]:
    """One episode: turns, tool calls and errors, trained and masked tokens, truncation and time in tools."""
    t = episode.trajectory
    trained = sum(t.loss_mask)
    return {
        "turns": float(t.turns),
        "tool_calls": float(episode.tools.calls),
        "tool_errors": float(episode.tools.errors),
        "used_tools": float(episode.tools.calls > 0),
        "trained_tokens": float(trained),
        "masked_tokens": float(len(t.loss_mask) - trained),
        "truncated": float(t.truncated),
        "tool_seconds": episode.tools.seconds,
    }


def batch_metrics(episodes: Sequence[Episode], prefix: str = "agent/") -> dict[str, float]:
    """Means over `episodes` (`agent/used_tools` is the tool-use rate, `agent/truncated` the truncation rate) and of
    the numbers each workflow adds (the OpenAI endpoint's `openai_calls`, `openai_segments`), plus the masked
    fraction of all tokens and a count per truncation reason; {} for no episodes. `prefix`: `agent/` for training
    batches, `eval/agent/` for the evaluator's episodes."""
    if not episodes:
        return {}
    rows = [episode_metrics(e) for e in episodes]
    out = {f"{prefix}{key}": statistics.fmean(r[key] for r in rows) for key in rows[0]}
    for key in sorted({k for e in episodes for k in e.info}):  # the workflow's own numbers (ctx.finish(**info))
        out[f"{prefix}{key}"] = statistics.fmean(e.info[key] for e in episodes if key in e.info)
    tokens = sum(r["trained_tokens"] + r["masked_tokens"] for r in rows)
    out[f"{prefix}masked_fraction"] = sum(r["masked_tokens"] for r in rows) / tokens if tokens else 0.0
    for episode in episodes:
        reason = episode.trajectory.truncation_reason
        if reason:
            key = f"{prefix}truncated_by/{reason}"
            out[key] = out.get(key, 0.0) + 1.0
    return out

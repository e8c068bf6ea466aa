"""Which completion tokens of a `Sample` a server sampled (and the trainer trains on), and at which weight version.

A multi-turn episode's completion interleaves tokens the servers sampled with tokens rlkit inserted (tool results,
user turns, chat-template glue). Only sampled tokens have a behaviour log-prob, an action to credit and a server to
compare with; an inserted token is context, never trained. Every trainer module asks here rather than reading
`loss_mask` itself, so the rule "None means every token was sampled" lives in one place. Pure (no torch): the
log-prob mismatch check uses it too.
"""

from __future__ import annotations

from rlkit.types import Sample


def check_sample(sample: Sample, index: int) -> None:
    """Raise ValueError naming the sample (its index in the batch, group, server) when a per-token list does not have
    one entry per completion token or the loss mask holds anything but 0 and 1: a trajectory builder bug must stop the
    step, not train on misaligned tokens. Called once per sample, where the batch enters the trainer
    (advantage_batch.prepare_batch): everything after relies on it."""
    n = len(sample.completion_ids)
    problems = [f"{len(values)} {what} for {n} tokens"
                for what, values in (("log-probs", sample.behav_logp), ("advantages", sample.token_advantages),
                                     ("loss-mask entries", sample.loss_mask),
                                     ("token versions", sample.token_versions))
                if values is not None and len(values) != n]
    if sample.loss_mask is not None and not _only_zeros_and_ones(sample.loss_mask):
        bad = sorted({repr(m) for m in sample.loss_mask if m not in (0, 1)})
        if bad:
            problems.append(f"loss mask entries must be 0 or 1, got {', '.join(bad[:5])}")
    if problems:
        raise ValueError(f"sample {index}: {'; '.join(problems)} (group {sample.group}, server {sample.server}, "
                         f"version {sample.version})")


def _only_zeros_and_ones(values: list[int]) -> bool:
    """The loss mask's common case at C speed (set building); unhashable entries take the slow path and its report."""
    try:
        return set(values) <= {0, 1}
    except TypeError:
        return False


def sampled_mask(sample: Sample) -> list[bool]:
    """Per completion token: whether a server sampled it (trained) rather than rlkit inserted it."""
    if sample.loss_mask is None:
        return [True] * len(sample.completion_ids)
    return [m == 1 for m in sample.loss_mask]


def sampled_count(sample: Sample) -> int:
    """The sample's length as far as training and length metrics are concerned: its sampled completion tokens (an
    episode's tool results and template glue are not the model's output)."""
    return len(sample.completion_ids) if sample.loss_mask is None else sum(1 for m in sample.loss_mask if m == 1)


def token_versions(sample: Sample) -> list[int]:
    """Per completion token, the weight version that sampled it (inserted tokens: whatever the builder wrote, -1)."""
    if sample.token_versions is None:
        return [sample.version] * len(sample.completion_ids)
    return list(sample.token_versions)


def positions_at(sample: Sample, version: int) -> list[int]:
    """Completion positions of the tokens sampled at weight `version` (the log-prob mismatch check's tokens: an
    episode may span a weight update, and inserted tokens have no server log-prob)."""
    return [j for j, (sampled, v) in enumerate(zip(sampled_mask(sample), token_versions(sample), strict=True))
            if sampled and v == version]

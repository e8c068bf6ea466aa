"""What a completion answer must be before its tokens become a training sample: the pool refuses (and retries on
another server) an answer a broken or foreign server sent, rather than let it reach the trainer.

A non-integer or negative token id would stop the trainer's embedding with an opaque index error (on a GPU a
device-side assert that kills the job); a NaN or infinite log-prob would turn the importance weights into
NaN and poison the step's loss without an error; more tokens than asked for, a log-prob per token missing, or fewer
completions than the group needs would misalign the batch. Each is a ValueError naming the server and the problem.
"""

from __future__ import annotations

import math

from rlkit.servers.backend import Completion, SamplingParams, Server


def check_completions(server: Server, completions: list[Completion], params: SamplingParams) -> list[Completion]:
    """`completions` if they are `params.n` well-formed completions within `params.max_new_tokens`, else ValueError
    saying what is wrong."""
    if not isinstance(completions, list) or len(completions) != params.n:
        count = len(completions) if isinstance(completions, list) else type(completions).__name__
        raise ValueError(f"{server.label} answered {count} completions for n={params.n}")
    for i, c in enumerate(completions):
        problem = completion_problem(c, params.max_new_tokens)
        if problem:
            raise ValueError(f"{server.label}: completion {i} {problem}")
    return completions


def completion_problem(c: Completion, max_new_tokens: int) -> str:
    """What is wrong with one completion ('' when nothing is)."""
    if not isinstance(c.text, str):
        return f"has a text of type {type(c.text).__name__}"
    ids, logps = c.token_ids, c.logprobs
    if len(ids) != len(logps):
        return f"has {len(ids)} token ids but {len(logps)} log-probs"
    if len(ids) > max_new_tokens:
        return f"has {len(ids)} tokens, more than the {max_new_tokens} asked for"
    bad_id = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad_id is not None:
        return f"has the token id {bad_id!r}, not a non-negative integer"
    # finite, not <= 0: vLLM's logprobs_mode raw_logits / processed_logits returns logits here, often positive
    bad_logp = next((x for x in logps if not (isinstance(x, float) and math.isfinite(x))), None)
    if bad_logp is not None:
        return f"has the log-prob {bad_logp!r}, not a finite number"
    return ""

"""Token log-probs (and entropies) of a causal LM without its full [B, L, V] logits (issue 46, part 3).

The full path (`chunk_tokens` 0) takes the model's logits and makes a float32 copy and a float32 log_softmax of them:
three tensors of tokens x vocabulary, ~24 GB for 16k tokens of Qwen's 152k vocabulary in bf16, plus the entropy's.
The chunked path runs the same model forward, with its output head swapped for the length of that one call: the head
then receives the final hidden states [B, L, H] and, for every `chunk_tokens` positions, computes float32 logits /
temperature, the next token's log-prob (and the entropy where asked), and frees the logits. Each chunk runs under
non-reentrant torch.utils.checkpoint, so backward recomputes one chunk's logits at a time: the head's peak memory
is O(chunk x V), not O(tokens x V). The entropy is a statistic without gradient unless `entropy_grad` (the actor's
entropy bonus, actor.entropy_coeff): then it is differentiated through the same recomputed chunks, and on the full
path through the full logits.

Why inside the forward rather than on hidden states taken out of it: under FSDP2 the head's weight belongs to the
root module's parameter group, gathered by the root's forward hooks (and by its pre-backward hook, which fires on the
forward's outputs); a head called after the forward could meet a sharded DTensor. The head module's own forward is
what runs per chunk (a LoRA-wrapped head, a head tied to the input embedding are both just the module; hooks
registered on the head module itself are not run, none of rlkit's are), and the chunks' log-probs (and entropies,
when they carry gradient) are the forward's output, so FSDP's backward hooks see them. Models that transform the
logits after the head (Gemma's soft-capping, Cohere's logit_scale, Granite's logits_scaling) take the full path: the
swapped head would skip that transform; so does a model that names no output head (get_output_embeddings: a model
factory's own model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, overload

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rlkit.config.schema.actor import LOGPROB_CHUNK_TOKENS
from rlkit.models import ulysses
from rlkit.models.packing import PackedRows, forward_packed, pack_rows, packs, rows_for
from rlkit.trainer.rl_math.losses import entropy_from_logits, entropy_statistic, next_token_logprobs

Head = Callable[[Tensor], Tensor]  # hidden states [N, H] -> logits [N, V]

# config.json keys of a transform applied to the logits after the head, with the value that means "no transform"
_POST_HEAD_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


def _chunk(head: Head, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool,
           entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
    """One chunk: float32 log-probs of `targets` [N] under head(hidden [N, H]) / temperature, and entropies (an empty
    tensor when not asked). Without `entropy_grad` the entropy has no gradient (as the full path's) and comes last,
    so that the checkpoint's recompute in backward stops before it; with it, backward recomputes it too."""
    logits = head(hidden).float()
    if temperature != 1.0:  # x / 1.0 is x: one [N, V] tensor fewer
        logits = logits / temperature
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if entropy_grad:
        return logp, entropy_from_logits(logits)
    if not with_entropy:
        return logp, logp.new_empty(0)
    return logp, entropy_statistic(logits.detach(), block=logits.shape[0] or 1)


def chunked_logprobs(head: Head, hidden: Tensor, targets: Tensor, *, temperature: float = 1.0, chunk_tokens: int,
                     with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """([B, T] float32 log-probs of targets [B, T], [B, T] entropies or None) where position t of hidden [B, T, H]
    predicts targets[:, t]: through `head` `chunk_tokens` positions at a time, each chunk's logits freed after use
    and recomputed in backward (the entropies' gradient too, with `entropy_grad`, which implies `with_entropy`)."""
    if chunk_tokens < 1:
        raise ValueError(f"a chunk needs at least one token, got {chunk_tokens}")
    with_entropy = with_entropy or entropy_grad
    batch, length, width = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(batch * length, width), targets.reshape(batch * length)
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, batch * length, chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (head, flat_hidden[part], flat_targets[part], temperature, with_entropy, entropy_grad)
        logp, entropy = checkpoint(_chunk, *args, use_reentrant=False) if torch.is_grad_enabled() else _chunk(*args)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:  # no positions at all: still [B, 0]
        empty = hidden.new_zeros((batch, 0), dtype=torch.float32)
        return empty, empty if with_entropy else None
    logp = torch.cat(logps).view(batch, length)
    return logp, torch.cat(entropies).view(batch, length) if with_entropy else None


def output_head(model: nn.Module) -> nn.Module | None:
    """The module that turns the final hidden states into logits (through a peft wrapper too); None for a model
    that names none (a model factory's own model) or whose forward changes the head's logits before returning them:
    only the full path is right for those."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    config = getattr(model, "config", None)
    if any(getattr(config, key, unset) not in (unset, None) for key, unset in _POST_HEAD_TRANSFORMS.items()):
        return None
    return head if isinstance(head, nn.Module) else None


@contextlib.contextmanager
def _head_computing(head: nn.Module, compute: Callable[[Head, Tensor], Tensor]) -> Iterator[None]:
    """For the duration of the block, calling `head` returns compute(head's own forward, hidden states)."""
    had_own = "forward" in head.__dict__  # an instance-level forward (accelerate's hooks) is restored as it was
    own = head.forward
    head.forward = lambda hidden: compute(own, hidden)
    try:
        yield
    finally:
        if had_own:
            head.forward = own
        else:
            del head.forward


def model_token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, *,
                         temperature: float = 1.0, chunk_tokens: int = LOGPROB_CHUNK_TOKENS, with_entropy: bool = False,
                         entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """[B, L-1] float32 log-probs of each next token of `input_ids` under `model` (logits / temperature), and [B, L-1]
    entropies when asked (`with_entropy`: no gradient; `entropy_grad`: with gradient): chunked through the output
    head when `chunk_tokens` > 0 (see the module docstring), else from the full logits. The rows run packed into one
    (rlkit.models.packing) when the model packs; the results are in the padded layout either way (0 at padding)."""
    with_entropy = with_entropy or entropy_grad
    if ulysses.enabled(model):
        return _sequence_parallel_logprobs(model, input_ids, attention_mask, temperature=temperature,
                                           chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                           entropy_grad=entropy_grad)
    rows = rows_for(model, input_ids, attention_mask)
    ids = rows.input_ids if rows is not None else input_ids

    def forward() -> Any:
        if rows is not None:
            return forward_packed(model, rows.input_ids, rows.position_ids)
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    head = output_head(model) if chunk_tokens > 0 else None
    if head is None:
        out: Any = forward()
        logp = next_token_logprobs(out.logits, ids, temperature)
        entropy = _full_entropy(out.logits[:, :-1], temperature, with_entropy, entropy_grad)
        return _padded(rows, logp), _padded(rows, entropy)
    entropies: list[Tensor | None] = []

    def compute(own_head: Head, hidden: Tensor) -> Tensor:
        logp, entropy = chunked_logprobs(own_head, hidden[:, :-1], ids[:, 1:], temperature=temperature,
                                         chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad)
        entropies.append(entropy)
        # the forward's "logits" [B, L-1, 1]: its output, so FSDP's backward hooks see it. A copy, not a view of
        # logp: FSDP2 warns at every forward of a root module that returns a view (an in-place op on it would drop
        # the pre-backward hook); the copy is B x L floats, nothing next to one chunk's logits
        return _head_output(logp, entropy, entropy_grad)

    with _head_computing(head, compute):
        out = forward()
    if len(entropies) != 1:
        raise RuntimeError(f"{type(model).__name__}'s forward called its output head {len(entropies)} times")
    entropy = out.logits[..., 1] if entropy_grad else entropies[0]
    return _padded(rows, out.logits[..., 0]), _padded(rows, entropy)


def _full_entropy(logits: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool) -> Tensor | None:
    """The full path's entropies of next-token logits [.., V] at `temperature`: with gradient, without, or None.
    With gradient under checkpoint: backward keeps only its input logits, not the softmax's [.., V] tensors
    (recomputed), as verl's entropy_checkpointing."""
    if not with_entropy and not entropy_grad:
        return None
    if entropy_grad and torch.is_grad_enabled():
        return checkpoint(_scaled_entropy, logits, temperature, use_reentrant=False)
    return entropy_statistic(logits.detach(), temperature)


def _scaled_entropy(logits: Tensor, temperature: float) -> Tensor:
    logits = logits.float()
    return entropy_from_logits(logits if temperature == 1.0 else logits / temperature)  # x / 1.0 is x


def _head_output(logp: Tensor, entropy: Tensor | None, entropy_grad: bool) -> Tensor:
    """What the swapped head returns as the forward's logits: [B, T, 1] log-probs, or [B, T, 2] log-probs and
    entropies when the entropies carry gradient (the forward's output then holds both, for FSDP's backward hooks)."""
    if entropy_grad:
        assert entropy is not None
        return torch.stack((logp, entropy), dim=-1)
    return logp[..., None].clone()


def sequence_parallel_split(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None
                            ) -> tuple[int, PackedRows | None, ulysses.RowSlice | None]:
    """(sp size, the batch's packed row, this rank's slice of it) for a model running sequence parallel; the row and
    slice are None when the batch runs padded: whole on every rank of the group, its results then need
    ulysses.shared_gradient (1/sp of the gradient each: FSDP adds the group's up)."""
    from rlkit.trainer.dist import sequence_parallel

    layout = sequence_parallel()
    if layout is None:
        raise RuntimeError("a model runs sequence parallel but this trainer has no sp group")
    rows = pack_rows(input_ids, attention_mask) if packs(model) else None
    if rows is None:
        return layout.size, None, None
    return layout.size, rows, ulysses.slice_row(rows, layout.group, layout.size, layout.local_rank)


def split_forward(model: nn.Module, piece: ulysses.RowSlice) -> Any:
    """model's forward over this rank's slice of a packed row; its attention sees the whole row (rlkit.models.ulysses).
    """
    with ulysses.sequence_parallel_forward():
        return model(input_ids=piece.input_ids, position_ids=piece.position_ids, use_cache=False,
                     **{ulysses.KEYWORD: piece})


def _sequence_parallel_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, *,
                                temperature: float, chunk_tokens: int, with_entropy: bool, entropy_grad: bool
                                ) -> tuple[Tensor, Tensor | None]:
    """model_token_logprobs under Ulysses sequence parallelism (rlkit.models.ulysses), the same results on every rank
    of the sp group: a packed row is split, each rank runs its slice and the log-probs are gathered; rows that run
    padded run whole on every rank of the group, their gradient shared."""
    size, rows, piece = sequence_parallel_split(model, input_ids, attention_mask)
    if rows is None or piece is None:
        with ulysses.unsplit(model):
            logp, entropy = model_token_logprobs(model, input_ids, attention_mask, temperature=temperature,
                                                 chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                                 entropy_grad=entropy_grad)
        if entropy_grad and entropy is not None:
            entropy = ulysses.shared_gradient(entropy, size)
        return ulysses.shared_gradient(logp, size), entropy
    head = output_head(model) if chunk_tokens > 0 else None
    entropies: list[Tensor | None] = []
    if head is None:
        logits = split_forward(model, piece).logits.float() / temperature
        logp = logits.log_softmax(-1).gather(-1, piece.targets[..., None]).squeeze(-1)
        entropies.append(_full_entropy(logits, 1.0, with_entropy, entropy_grad))
    else:
        def compute(own_head: Head, hidden: Tensor) -> Tensor:
            logp, entropy = chunked_logprobs(own_head, hidden, piece.targets, temperature=temperature,
                                             chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                             entropy_grad=entropy_grad)
            entropies.append(entropy)
            return torch.stack((logp, entropy), dim=-1) if entropy_grad and entropy is not None else logp[..., None]

        with _head_computing(head, compute):
            out = split_forward(model, piece).logits
        logp = out[..., 0]
        if entropy_grad:
            entropies[0] = out[..., 1]
    entropy = entropies[0]
    return rows.unpack_next(piece.gather(logp)), None if entropy is None else rows.unpack_next(piece.gather(entropy))


@overload
def _padded(rows: PackedRows | None, values: Tensor) -> Tensor: ...
@overload
def _padded(rows: PackedRows | None, values: None) -> None: ...
def _padded(rows: PackedRows | None, values: Tensor | None) -> Tensor | None:
    """Next-token values [B, L-1] from a packed forward's [1, N-1] (as they are from a padded one)."""
    return values if rows is None or values is None else rows.unpack_next(values)

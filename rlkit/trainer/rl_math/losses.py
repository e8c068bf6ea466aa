"""Policy-gradient losses (PPO/GRPO/GSPO actor, decoupled PPO), the KL loss term and entropy, on [B, T] tensors."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlkit.config.schema.actor import POLICY_LOSSES, RejectionSamplingConfig
from rlkit.trainer.rl_math.aggregation import aggregate
from rlkit.trainer.rl_math.m2po import m2po_keep_mask
from rlkit.trainer.rl_math.policy_losses import cispo_token_loss, gmpo_sequence_loss, gpg_token_loss
from rlkit.trainer.rl_math.rejection import behaviour_weights, rejection_config
from rlkit.trainer.rl_math.sapo import sapo_token_loss


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def _masked_max(x: Tensor, mask: Tensor) -> Tensor:
    if not bool(mask.any()):
        return x.new_zeros(())
    return x[mask].max()


def ppo_actor_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    importance_sampling_level: Literal["token", "sequence"] = "token",
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    rejection_sampling: RejectionSamplingConfig | None = None,
    log_ratio_clamp: float | None = 20.0,
    seq_log_ratio_clamp: float | None = 10.0,
    sapo_taus: tuple[float, float] | None = None,
    m2_threshold: float | None = None,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    policy_loss: str = "ppo",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO actor loss over `loss_mask`, averaged as `loss_agg_mode` says (token-mean by default;
    rlkit.trainer.rl_math.aggregation, `loss_scale_factor` the constant of seq-mean-token-sum-norm); returns the loss
    and detached stats.

    As AReaL's `ppo_actor_loss_fn` (areal/utils/functional/functional.py at 4aef98d8), plus verl's guards:
    the token log-ratio is clamped to +-`log_ratio_clamp` before exp (verl: 20) and GSPO's sequence log-ratio to
    at most `seq_log_ratio_clamp` (verl: 10), so one extreme token cannot blow up a step; stats count the clamps.
    `importance_sampling_level="sequence"` is GSPO: one ratio per sequence, exp of the mean log-ratio over its
    (kept) tokens, and the sequence's mean advantage. `c_clip` is dual clip. With `behav_logp` (decoupled loss)
    `old_logp` is the proximal policy and each token's loss is weighted by pi_prox / pi_behav, bounded by
    `rejection_sampling` or its older form `behav_imp_weight_cap` (rlkit.trainer.rl_math.rejection); the denominator
    stays the number of tokens (sequences) in `loss_mask`. `approx_kl` is mean(logp - old_logp), AReaL's sign.
    `sapo_taus` (tau_pos, tau_neg) puts SAPO's soft gate in place of the clip (rlkit.trainer.rl_math.sapo; not with
    c_clip or behav_logp, as AReaL). `m2_threshold` (needs behav_logp) first narrows `loss_mask` by M2PO
    (rlkit.trainer.rl_math.m2po), so the aggregation runs over the tokens it keeps, as in AReaL.
    `policy_loss` cispo, gmpo or gpg puts that loss in place of the clip (rlkit.trainer.rl_math.policy_losses; token
    ratios only, no c_clip or SAPO), eps_clip and eps_clip_higher its bounds (gmpo: in log space); gmpo's loss is
    a mean over the sequences whatever seq-mean `loss_agg_mode` (verl's), so token-mean is refused.
    """
    shape = logp.shape
    others = {"old_logp": old_logp, "advantages": advantages, "loss_mask": loss_mask}
    if behav_logp is not None:
        others["behav_logp"] = behav_logp
    for name, t in others.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logp")
    if c_clip is not None and c_clip <= 1.0:
        raise ValueError(f"c_clip must be > 1, got {c_clip}")
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    if sapo_taus is not None and (c_clip is not None or behav_logp is not None):
        raise ValueError("SAPO replaces the clip: it takes neither c_clip nor behav_logp (the decoupled loss)")
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(f"policy_loss must be one of {', '.join(POLICY_LOSSES)}, got {policy_loss!r}")
    if policy_loss != "ppo" and (c_clip is not None or sapo_taus is not None or importance_sampling_level != "token"):
        raise ValueError(f"policy_loss {policy_loss} replaces PPO's clip: no c_clip, SAPO or sequence-level ratio")
    if policy_loss == "gmpo" and loss_agg_mode == "token-mean":
        raise ValueError("GMPO's loss is a mean over sequences: it needs a seq-mean loss_agg_mode, not token-mean")
    stats: dict[str, Tensor] = {}
    if m2_threshold is not None:
        if behav_logp is None:
            raise ValueError("M2PO needs behav_logp: it bounds the behaviour importance weight pi_prox / pi_behav")
        kept = m2po_keep_mask(old_logp - behav_logp, loss_mask, m2_threshold)
        total = loss_mask.bool().sum()
        stats["m2po_masked_fraction"] = (total - kept.sum()) / total.clamp(min=1)
        loss_mask = kept
    orig_mask = loss_mask.bool()
    mask = orig_mask
    weight = None
    if behav_logp is not None:
        bw = behaviour_weights(old_logp, behav_logp, orig_mask, rejection_config(behav_imp_weight_cap,
                               rejection_sampling), log_ratio_clamp=log_ratio_clamp)
        mask, weight = bw.mask, bw.weight
        stats["behav_weight_mean"] = _masked_mean(weight, mask)
        stats["behav_filtered_fraction"] = bw.filtered_fraction
    adv = torch.where(mask, advantages, 0.0).detach()
    # Zero the padded positions before exp so garbage there can neither overflow nor leak gradient.
    raw_log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0)
    if importance_sampling_level == "sequence":
        count = mask.sum(dim=-1, keepdim=True).clamp(min=1)
        seq_log_ratio = raw_log_ratio.sum(dim=-1, keepdim=True) / count
        if seq_log_ratio_clamp is not None:
            stats["seq_log_ratio_clamped"] = (seq_log_ratio.detach() > seq_log_ratio_clamp).sum().float()
            seq_log_ratio = seq_log_ratio.clamp(max=seq_log_ratio_clamp)
        log_ratio = torch.where(mask, seq_log_ratio.expand_as(raw_log_ratio), 0.0)
        adv = torch.where(mask, (adv.sum(dim=-1, keepdim=True) / count).expand_as(adv), 0.0)
    else:
        log_ratio = raw_log_ratio
        if log_ratio_clamp is not None:
            stats["log_ratio_clamped"] = ((log_ratio.detach().abs() > log_ratio_clamp) & mask).sum().float()
            log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    low, high = eps_clip, eps_clip if eps_clip_higher is None else eps_clip_higher
    if policy_loss == "gmpo":  # one ratio per sequence, its loss a mean over the sequences (no token values)
        per_row, seq_ratio, clip_mask = gmpo_sequence_loss(log_ratio, adv, mask, low, high, weight)
        ratio = torch.where(mask, seq_ratio[:, None].expand_as(log_ratio), 1.0)
        loss = per_row.sum() / max(1, int(orig_mask.any(dim=-1).sum()))
        return loss, _stats(stats, mask, clip_mask, torch.zeros_like(mask), ratio, raw_log_ratio)
    if policy_loss in ("cispo", "gpg"):  # log pi itself enters: padding's may be anything
        own_logp = torch.where(mask, logp, 0.0)
        if policy_loss == "cispo":
            loss_tok, clipped = cispo_token_loss(own_logp, ratio, adv, low, high)
            clip_mask = clipped & mask
        else:
            loss_tok, clip_mask = gpg_token_loss(own_logp, adv), torch.zeros_like(mask)
    elif sapo_taus is not None:  # SAPO never clips: clip_fraction stays 0, as AReaL logs it
        loss_tok, gate = sapo_token_loss(ratio, adv, *sapo_taus)
        clip_mask = torch.zeros_like(mask)
        stats["sapo_soft_gate"] = _masked_mean(gate.detach(), mask)
    else:
        loss1 = -adv * ratio
        loss2 = -adv * ratio.clamp(1.0 - low, 1.0 + high)
        loss_tok = torch.maximum(loss1, loss2)
        clip_mask = (loss2.detach() > loss1.detach()) & mask
    dual_clip_mask = torch.zeros_like(mask)
    if c_clip is not None:
        loss3 = -c_clip * adv
        dual_clip_mask = (adv < 0) & (loss3 < loss_tok.detach()) & mask
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, loss3), loss_tok)
    if weight is not None:
        loss_tok = loss_tok * weight
    # the tokens the behaviour bound dropped add 0 but stay counted: the units are those of `loss_mask`
    loss, _ = aggregate(torch.where(mask, loss_tok, 0.0), orig_mask, loss_agg_mode, scale_factor=loss_scale_factor)
    return loss, _stats(stats, mask, clip_mask, dual_clip_mask, ratio, raw_log_ratio)


@torch.no_grad()
def _stats(stats: dict[str, Tensor], mask: Tensor, clip_mask: Tensor, dual_clip_mask: Tensor, ratio: Tensor,
           log_ratio: Tensor) -> dict[str, Tensor]:
    """`stats` with the loss's clip fractions, ratio and approx_kl over `mask`, every value detached."""
    stats.update(
        clip_fraction=_masked_mean(clip_mask.float(), mask),
        dual_clip_fraction=_masked_mean(dual_clip_mask.float(), mask),
        importance_weight_mean=_masked_mean(ratio.detach(), mask),
        importance_weight_max=_masked_max(ratio.detach(), mask),
        approx_kl=_masked_mean(log_ratio.detach(), mask),
    )
    return {k: v.detach() for k, v in stats.items()}


def next_token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, L-1] log-probability of each next token (token t+1 given tokens 0..t) from [B, L, V] logits, in float32;
    `temperature`: the log-probs of the sampling distribution logits / T (the engine's, under the rollout's T)."""
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@torch.no_grad()
def entropy_statistic(logits: Tensor, temperature: float = 1.0, *, block: int = 1024) -> Tensor:
    """entropy_from_logits(logits / temperature) without gradient (the actor's `actor/entropy` statistic), `block`
    positions at a time, the softmax and its product taken in place: two float32 [block, V] tensors beside the logits
    instead of four of the logits' size (the full-logits path's [T, V] times four; the division by the temperature
    too)."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], block):
        z = flat[start : start + block].float()
        if temperature != 1.0:
            z = z / temperature
        logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
        del z
        # p log p with p = 0 (a -inf logit) is 0 * -inf = nan: such a token adds nothing
        out[start : start + block] = -torch.nan_to_num_(logp.exp().mul_(logp), nan=0.0).sum(dim=-1)
    return out.view(logits.shape[:-1])


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax distribution at each position (last dim is the vocabulary); -inf logits are fine."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    safe_logp = logp.clamp(min=torch.finfo(logp.dtype).min)
    return -(logp.exp() * safe_logp).sum(dim=-1)

"""The trained model's section (`actor`): model, optimizer, micro-batching, and the PPO/GRPO knobs.

Kept apart from rlkit.config.schema.experiment so that each file stays one screenful of fields; field names follow
AReaL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rlkit.config.schema.fields import _f, _sub

# How new weights reach the servers: the one list of actor.weight_update_mode's values (rlkit.weights.base's registry
# is keyed by it, submit-time validation offers it).
WeightUpdateMode = Literal["disk", "xccl"]
WEIGHT_UPDATE_MODES: tuple[WeightUpdateMode, ...] = get_args(WeightUpdateMode)
# actor.logprob_chunk_tokens' default, also what a log-prob function uses when its caller has no config: big enough
# for a GPU's matmul to run at speed, small enough that a chunk's float32 logits of a 152k vocabulary are ~0.6 GB
LOGPROB_CHUNK_TOKENS = 1024
# config.json model_type values whose attention rlkit.models.ulysses serves (actor.fsdp.ulysses_sp_size > 1): their
# attention layers call transformers' ALL_ATTENTION_FUNCTIONS with (q, k, v) after the rotary embedding, [batch, heads,
# tokens, head_dim], and take back [batch, tokens, heads, head_dim] (each checked: tests/unit/trainer/test_ulysses.py)
ULYSSES_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# mb_spec.packing_algorithm's values (AReaL's names; rlkit.trainer.bins implements them)
PACKING_ALGORITHMS = ("ffd", "kk")
# actor.loss_agg_mode's values (verl's names): how the policy loss is averaged (rlkit.trainer.rl_math.aggregation)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# the adaptive KL controller's bound on one step's proportional error, both ways (Ziegler et al.'s, verl's)
KL_CONTROL_ERROR_CLIP = 0.2
# actor.prox_logp_method's values (AReaL's names; rlkit.trainer.rl_math.proximal approximates)
PROX_LOGP_METHODS = ("recompute", "loglinear", "metrics")
# actor.policy_loss's values (rlkit.trainer.rl_math.losses, rlkit.trainer.rl_math.policy_losses); verl's loss_mode
# names them vanilla, cispo, geo_mean, gpg
POLICY_LOSSES = ("ppo", "cispo", "gmpo", "gpg")


@dataclass
class MicroBatchSpec:
    """How a minibatch is split into micro-batches for forward/backward."""

    n_mbs: int = _f(1, "Fewest micro-batches per minibatch (per rank); with max_tokens_per_mb, more when needed.",
                    ge=1)
    max_tokens_per_mb: int | None = _f(
        None, "Most tokens per micro-batch (more micro-batches when needed): real tokens when packing, rows x the "
        "longest row when not; a sequence longer than this gets a micro-batch of its own.", ge=1)
    n_mbs_divisor: int = _f(1, "Packing: the number of micro-batches is rounded up to a multiple of this.", ge=1)
    packing_algorithm: str = _f(
        "ffd", "Packing: how sequences are balanced over micro-batches and trainer ranks by tokens. Choices: ffd "
        "(longest first into the lightest bin), kk (Karmarkar-Karp: better balance on skewed lengths).")
    packing: bool = _f(
        True, "Run each micro-batch's sequences concatenated into one row without padding (position_ids restart at "
        "each sequence, attention never crosses one; the same results as padded rows), balanced by tokens over "
        "micro-batches and ranks; false: right-padded rows in their order. A model whose attention cannot take "
        "packed rows runs padded, said in the trainer log.")


@dataclass
class FsdpConfig:
    """How the trainer's ranks share the model beyond FSDP's sharding (AReaL's `actor.fsdp`)."""

    ulysses_sp_size: int = _f(
        1, "Ulysses sequence parallelism: groups of this many trainer ranks share each packed sequence, each rank "
        "holding 1/sp of its tokens, attention heads exchanged by all-to-all, so one rank's memory carries 1/sp of "
        "the sequence; the data-parallel degree is ranks / sp. Needs packing (mb_spec.packing), attention and KV "
        "heads divisible by it (or KV heads dividing it), a supported model family (Qwen2/3, Llama, Mistral) and "
        "grpo, opmd, sft or ppo (whose critic.fsdp.ulysses_sp_size must be the same); 1: off.", ge=1, le=64)


@dataclass
class OptimizerConfig:
    """The trainer's optimizer and learning-rate schedule."""

    type: str = _f("adam", "Optimizer. Choices: adam (AdamW), sgd.")
    lr: float = _f(2e-5, "Peak learning rate (reached after the warmup).", gt=0)
    weight_decay: float = _f(0.05, "Weight decay coefficient (adam: AdamW's decoupled decay).", ge=0)
    beta1: float = _f(0.9, "Adam beta1.", ge=0, lt=1)
    beta2: float = _f(0.95, "Adam beta2.", ge=0, lt=1)
    eps: float = _f(1e-5, "Adam epsilon.", gt=0)
    lr_scheduler_type: str = _f("constant", "Schedule after warmup. Choices: constant, linear, cosine.")
    warmup_steps_proportion: float = _f(0.001, "Fraction of the total training steps spent warming the learning "
                                               "rate up linearly.", ge=0, le=1)
    min_lr_ratio: float = _f(0.0, "Final learning rate as a fraction of lr (linear and cosine).", ge=0, le=1)
    gradient_clipping: float = _f(1.0, "Clip the global gradient norm to this; 0 disables clipping.", ge=0)


@dataclass
class NormConfig:
    """Normalisation of rewards (reward_norm, per sequence) or advantages (adv_norm, per token), as AReaL's.

    The mean is subtracted at mean_level, then the result is divided by (std + eps), where the std is taken at
    std_level around the mean actually subtracted (0 when mean_level is none). Token-level statistics are weighted
    by tokens. A level of null (or "none") skips that step.
    """

    mean_level: str | None = _f("batch", "Where the mean is taken. Choices: batch, group, null (no centring).")
    std_level: str | None = _f("batch", "Where the std is taken. Choices: batch, group, null (no scaling).")
    mean_leave1out: bool = _f(False, "Leave each sample out of its own mean (RLOO).")
    std_unbiased: bool = _f(True, "Bessel-corrected std (divide by n - 1).")
    eps: float = _f(1e-5, "Added to the std before dividing (not used when std_level is null).")
    group_size: int | None = _f(None, "Samples per group at group level; null: actor.group_size.", ge=1)


@dataclass
class KLControlConfig:
    """The adaptive KL controller of Ziegler et al. 2019 (verl's algorithm.kl_ctrl.type adaptive, Trinity-RFT's
    adaptive: true; rlkit.trainer.rl_math.kl_controller): actor.kl_ctl is the starting coefficient, and after every
    step it is multiplied by 1 + clip(kl / target_kl - 1, -0.2, 0.2) x sequences / horizon, kl being the step's
    measured KL (each sequence's token mean of the penalty's estimate, then the mean over the batch's sequences)."""

    target_kl: float = _f(0.1, "The KL (per token, of actor.kl_estimator) the coefficient steers toward: above it "
                          "the penalty grows, below it shrinks (verl's default 0.1).", gt=0)
    horizon: int = _f(10000, "Sequences over which a full proportional error acts: the larger, the slower the "
                      "coefficient moves (at most 0.2 x the step's sequences / horizon per step; verl's default "
                      "10000).", ge=1)


@dataclass
class RejectionSamplingConfig:
    """Decoupled loss: what to do with tokens whose proximal/behaviour divergence is out of bounds (AReaL's block).

    The behaviour importance weight is pi_prox / pi_behav. `mask` drops out-of-bounds tokens (or whole sequences)
    from the loss; `clamp` keeps them with the weight clamped to [lower, upper] (verl's truncated IS, TIS).
    """

    level: str = _f("token", "Judge each token, or each sequence as a whole. Choices: token, sequence.")
    action: str = _f("mask", "Out of bounds: mask (drop from the loss) or clamp (truncate the weight).")
    metric: str = _f("ratio", "What is bounded. Choices: ratio (pi_prox/pi_behav), kl_k1, kl_k2, kl_k3.")
    agg: str = _f("mean", "Sequence level: aggregate tokens by sum, mean or max (ratio: in log space).")
    upper: float = _f(5.0, "Upper bound of the metric (ratio: > 1).")
    lower: float | None = _f(None, "Lower bound of the metric; null: none (clamp: 0).")


@dataclass
class ActorConfig:
    """The policy model and how it is trained (PPO/GRPO actor)."""

    path: str = _f("", "Hugging Face model directory (weights + tokenizer).")
    dtype: str = _f("bfloat16", "Parameter dtype in training. Choices: bfloat16, float16, float32.")
    gradient_checkpointing: bool = _f(True, "Recompute activations in backward to save memory.")
    disable_dropout: bool = _f(False, "Build the trained model with every dropout of its config.json at 0 (the servers "
                                      "never drop out, so training-mode log-probs then match theirs).")
    init_from_scratch: bool = _f(False, "Start from random weights in actor.path's architecture (one fixed seed: "
                                        "every rank alike); sft and rw only.")
    attn_impl: str = _f("flash_attention_2", "Attention kernel; falls back to sdpa when flash-attn is not installed.")
    mb_spec: MicroBatchSpec = _sub(MicroBatchSpec, "How a minibatch is split into micro-batches (memory, not the "
                                                   "update).")
    fsdp: FsdpConfig = _sub(FsdpConfig, "Sharing the model over the trainer ranks (sequence parallelism).")
    logprob_chunk_tokens: int = _f(
        LOGPROB_CHUNK_TOKENS, "Token log-probs (grpo, ppo's actor, sft, dpo, the reference) go through the output "
        "head this many tokens at a time, each chunk's logits freed and recomputed in backward, so the head's memory "
        "is chunk x vocabulary instead of tokens x vocabulary (~0.6 GB of float32 logits per 1k tokens of a 152k "
        "vocabulary); 0: the model's full logits at once.", ge=0)
    optimizer: OptimizerConfig = _sub(OptimizerConfig, "Optimizer and learning-rate schedule.")
    weight_update_mode: str = _f(
        "disk", "How new weights reach the servers. Choices: disk (a Hugging Face checkpoint on the shared filesystem "
        "that every server reloads), xccl (broadcast from trainer rank 0 to every server's workers: NCCL on GPUs, "
        "gloo on the CPU).")
    weight_update_delta: bool = _f(
        False, "Send only the elements that changed since the last push (flat indices and values) when that is "
        "smaller, to vLLM servers by disk or (CPU servers) broadcast: worth it for bfloat16 weights at RL learning "
        "rates (15x fewer bytes measured at lr 1e-6), not in float32. Costs one copy of the weights in host memory "
        "on trainer rank 0 and in every server worker; a restarted or failed server gets a full push.")
    weight_chunked_mem_mb: int = _f(
        1024, "xccl: full tensors are gathered and broadcast in buckets of about this many MiB, which bounds the "
        "trainer's extra memory during a push.", ge=1)
    weight_update_timeout: float = _f(
        600.0, "Seconds any one part of a weight push may take (a server's reload, joining the broadcast group, one "
        "bucket); a server that takes longer is named and the push fails instead of hanging.", gt=0)
    weight_update_interval: int = _f(
        1, "Push the weights to the servers after every k-th step (Trinity-RFT's synchronizer.sync_interval); the "
        "servers' weight version and rollout.max_head_offpolicyness count pushes, not steps, and every push is "
        "fingerprint-checked (grpo, ppo, opmd).", ge=1)
    weight_update_offset: int = _f(
        0, "Steps trained before the first push, on batches the servers generate ahead with the starting weights "
        "(Trinity-RFT's synchronizer.sync_offset); then a push every weight_update_interval steps.", ge=0)
    weight_check_tolerance: float | None = _f(
        None, "Largest mean |logprob difference| between a server and the trainer on the probe sequence after a "
        "weight update; None: 1e-3 when servers and trainer both compute in float32, 0.1 when both in the same 16-bit "
        "dtype, 0.3 when their dtypes differ.", gt=0)
    logprob_mismatch_warn: float | None = _f(
        None, "Warn (trainer log, rlkit status) when a server's mean |logprob difference| from the trainer over a "
        "step's rollout tokens sampled at the current weight version exceeds this; None: 1e-2 when servers and "
        "trainer run float32, 0.1 otherwise.", gt=0)
    group_size: int = _f(1, "Completions per prompt in one GRPO group: gconfig.n_samples (what a config that "
                         "leaves it out gets, as in AReaL's current configs).", ge=1)
    ppo_n_minibatches: int = _f(4, "Optimizer steps per training step (the batch is split into this many).", ge=1)
    ppo_epochs: int = _f(
        1, "Passes over a training step's batch (verl's ppo_epochs): the ppo_n_minibatches optimizer steps are "
        "repeated this many times over the same minibatches (the same split each pass, as verl's), with the same old "
        "log-probs and advantages; the learning-rate schedule counts every pass's steps (grpo, ppo's actor, opmd, "
        "distill).", ge=1)
    policy_loss: str = _f(
        "ppo", "The policy loss. ppo: PPO's clipped surrogate (GSPO with importance_sampling_level sequence, SAPO "
        "with use_sapo_loss). cispo (MiniMax-M1; verl's cispo, TRL's loss_type cispo): -w A log pi per token, w the "
        "ratio clipped to [1 - eps_clip, 1 + eps_clip_higher] and taken as a constant, so a clipped token keeps its "
        "gradient (TRL's cap epsilon_high on the ratio itself, no floor: eps_clip 1, eps_clip_higher epsilon_high - "
        "1). gmpo (verl's geo_mean): -A x the geometric mean of the sequence's ratios, each log-ratio clipped to "
        "[-eps_clip, eps_clip_higher] on the side that limits the update, a mean over sequences (needs a seq-mean "
        "loss_agg_mode). gpg: -A log pi (no ratio, no clip; verl's gpg). The decoupled loss's weight multiplies each "
        "(gmpo: its geometric mean over the sequence). Choices: ppo, cispo, gmpo, gpg.")
    eps_clip: float = _f(0.2, "Clip range of the policy ratio (lower side when eps_clip_higher is set); 0 clips the "
                         "ratio to 1 (AReaL's M2PO example, whose single minibatch never moves the ratio off 1). "
                         "policy_loss cispo: the weight's lower bound is 1 - eps_clip (1 or more: none); gmpo: a "
                         "bound on the log-ratio.", ge=0)
    eps_clip_higher: float | None = _f(None, "Upper clip range (DAPO clip-higher; cispo: the weight's upper bound is "
                                       "1 + this; gmpo: the log-ratio's); None: eps_clip.", gt=0)
    c_clip: float | None = _f(None, "Dual-clip bound for negative advantages (> 1); None: off.", gt=1)
    reward_scaling: float = _f(1.0, "Multiply rewards by this (after the overlong penalty and the bias).")
    reward_bias: float = _f(0.0, "Add this to rewards (after the overlong penalty).")
    reward_clip: float = _f(20.0, "Clip rewards to [-reward_clip, reward_clip] after bias and scaling.", gt=0)
    reward_norm: NormConfig | None = _f(None, "Normalise sequence rewards (after the clip); null: off.")
    passk_advantage: bool = _f(
        False, "Pass@k advantage (verl's grpo_passk, arXiv 2503.19595): after reward_norm, each group's best "
        "completion keeps its margin over the group's second best (over the group's std + eps when reward_norm's "
        "std_level is group), every other completion gets 0, as does a group tied at the top; needs actor.group_size "
        "2 or more.")
    gpg_scale: bool = _f(
        False, "GPG's correction (verl's gpg, arXiv 2504.02546): after reward_norm (and pass@k), every advantage is "
        "multiplied by the batch's samples over those with a nonzero reward (at least 1).")
    overlong_reward_penalty: bool = _f(False, "Penalise completions that run into the last overlong_tokens tokens.")
    overlong_tokens: int | None = _f(None, "Tokens of the soft-penalty zone that ends at gconfig.max_new_tokens.", ge=1)
    overlong_penalty_factor: float | None = _f(None, "Largest penalty (subtracted from the reward), reached at "
                                               "gconfig.max_new_tokens.", ge=0)
    mask_no_eos_with_zero: bool = _f(False, "Drop completions cut at max_new_tokens from the actor's loss (a critic "
                                     "still trains on them, to their returns, unless critic.mask_no_eos_with_zero).")
    kl_ctl: float = _f(0.0, "KL reward penalty: kl_ctl * KL(old || ref) is subtracted from each token's reward "
                       "before the advantages (no gradient through it); > 0 loads the reference model.", ge=0)
    kl_ctl_adaptive: KLControlConfig | None = _f(
        None, "Adapt the KL reward penalty's coefficient after every step toward a target KL, starting from kl_ctl "
        "(Ziegler et al.'s controller, verl's kl_ctrl.type adaptive); the coefficient is logged as actor/kl_ctl and "
        "resumed with the run. null: kl_ctl stays fixed.")
    kl_estimator: str = _f("k1", "Estimator of the kl_ctl penalty. Choices: k1, k2, k3.")
    kl_penalty_level: str = _f(
        "token", "Where the kl_ctl penalty enters the advantages. token (AReaL's order): on each token's reward after "
        "the sequence advantage, so a token's return holds the penalties from it on. sequence (verl's "
        "use_kl_in_reward with its outcome estimators: grpo, rloo, opo, gpg, grpo_passk, REINFORCE++-baseline): "
        "summed over the sequence's tokens and subtracted from its reward before reward_norm, every token then "
        "taking that one advantage; read only with kl_ctl > 0, and ppo (GAE) and opmd take token only. Choices: "
        "token, sequence.")
    kl_loss_coef: float = _f(0.0, "KL loss: kl_loss_coef * mean KL(pi || ref) is added to the loss (with "
                             "gradient, verl's use_kl_loss); > 0 loads the reference model.", ge=0)
    kl_loss_type: str = _f("k3", "Estimator of the KL loss term. Choices: k1, k2, k3.")
    entropy_coeff: float = _f(0.0, "Entropy bonus (verl's entropy_coeff): entropy_coeff * the entropy of the policy "
                              "at gconfig.temperature over the trained tokens (averaged as actor.loss_agg_mode "
                              "says, as verl does) is subtracted from the "
                              "actor's loss, with gradient (grpo, ppo's actor, opmd, distill); 0: off, the entropy "
                              "is then only a statistic.", ge=0)
    kl_clamp: float | None = _f(10.0, "Clamp every KL estimate to [-kl_clamp, kl_clamp]; null: off.", gt=0)
    log_ratio_clamp: float | None = _f(20.0, "Clamp the token log-ratio to [-x, x] before exp; null: off.", gt=0)
    seq_log_ratio_clamp: float | None = _f(10.0, "GSPO: clamp the sequence log-ratio to at most this before exp; "
                                           "null: off.", gt=0)
    discount: float = _f(1.0, "Discount factor of the returns, per token.", ge=0, le=1)
    gae_lambda: float = _f(1.0, "GAE lambda (1 without a critic: the return).", ge=0, le=1)
    adv_norm: NormConfig | None = _f(None, "Normalise the per-token advantages (token-weighted); null: off.")
    importance_sampling_level: str = _f("token", "Policy ratio per token, or per sequence (GSPO).")
    loss_agg_mode: str = _f(
        "token-mean", "How the policy loss and the KL loss term are averaged over the minibatch (every rank's): "
        "token-mean (every trained token alike, DAPO), seq-mean-token-mean (each sequence's mean, then the mean over "
        "sequences: the GRPO paper), seq-mean-token-sum (each sequence's sum, then the mean over sequences), "
        "seq-mean-token-sum-norm (each sequence's sum over loss_scale_factor, then the mean over sequences: "
        "Dr.GRPO). Choices: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm.")
    loss_scale_factor: int | None = _f(
        None, "seq-mean-token-sum-norm's constant (Dr.GRPO's): each sequence's token-sum is divided by it; None: "
        "gconfig.max_new_tokens.", ge=1)
    use_decoupled_loss: bool = _f(False, "Decoupled PPO: weight by pi_prox/pi_behav for stale samples.")
    prox_logp_method: str = _f(
        "recompute", "Decoupled loss: where the proximal policy's log-probs come from. Choices: recompute (a forward "
        "pass over the batch before the update), loglinear (no forward pass: each token's log-prob interpolated in "
        "log space between the servers' and the training forward's by weight versions, as AReaL; tokens at most one "
        "version behind keep the servers'), metrics (recompute, and log how far loglinear is from it: "
        "actor/loglinear_*).")
    behav_imp_weight_cap: float | None = _f(None, "Older AReaL form of rejection_sampling: drop tokens whose "
                                            "behaviour importance weight exceeds this (> 1).")
    rejection_sampling: RejectionSamplingConfig | None = _f(
        None, "Decoupled loss: bound the behaviour importance weight (mask or clamp); null: unbounded.")
    m2_threshold: float | None = _f(
        None, "M2PO (second-moment trust): in each micro-batch, drop the tokens of largest (log pi_prox/pi_behav)^2 "
        "until the mean of the rest is below this (e.g. 0.04); needs use_decoupled_loss. null: off.", gt=0)
    use_sapo_loss: bool = _f(False, "SAPO: a soft sigmoid gate on the policy ratio in place of PPO's clip (so "
                             "eps_clip is not used; not with eps_clip_higher, c_clip or use_decoupled_loss).")
    sapo_tau_pos: float = _f(1.0, "SAPO: gate temperature for positive advantages (larger: the gradient fades "
                             "faster as the ratio leaves 1).", gt=0)
    sapo_tau_neg: float = _f(1.05, "SAPO: gate temperature for negative advantages (and zero ones).", gt=0)
    dynamic_sampling: bool = _f(False, "Drop groups whose rewards are all equal (no learning signal, DAPO).")
    recompute_logprob: bool = _f(
        True, "Recompute log-probs with the trainer's weights before the update (else use the servers' log-probs as "
        "the old policy). With one optimizer step over the batch (ppo_n_minibatches 1, ppo_epochs 1), kl_ctl 0 and no "
        "dropout in the trained model, the update's own forward gives the same numbers and its forward pass is "
        "skipped (said in the trainer log; job type distill always recomputes).")
    # ---- LoRA (peft): only the adapters train, and only the adapters go to the servers ----
    use_lora: bool = _f(False, "Train LoRA adapters (peft) instead of every weight (grpo, ppo's actor, sft, dpo); "
                        "the servers get the adapters only (vLLM runtime LoRA loading, a new adapter name per "
                        "weight version); saved checkpoints are the merged model plus adapter/.")
    lora_rank: int = _f(32, "LoRA rank r (the servers are started with --max-lora-rank of at least this).", ge=1)
    lora_alpha: int = _f(16, "LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.", gt=0)
    target_modules: list[str] = _f([], "Module names that get adapters, e.g. [q_proj, k_proj, v_proj, o_proj]; "
                                   "'all-linear' for every linear layer but the output head.")
    peft_type: str = _f("lora", "peft method. Choices: lora.")


def recomputes_logprobs(actor: ActorConfig) -> bool:
    """Whether a step runs the forward pass of the log-probs before the update: recompute_logprob, unless the
    decoupled loss approximates its proximal policy instead (prox_logp_method loglinear)."""
    return actor.recompute_logprob and not approximates_proximal(actor)


def reuses_training_logprobs(actor: ActorConfig, *, dropout: bool) -> bool:
    """Whether a step skips the log-probs' forward before the update, the loss taking each micro-batch's training
    forward (detached) as the proximal policy's log-probs (ratio exactly 1: TRL's GRPO at num_iterations 1, verl's
    on-policy path). They are the same numbers only when the weights cannot move between the two forwards: one
    optimizer step over the batch (ppo_n_minibatches 1, ppo_epochs 1); nothing reads them before the update (the KL
    reward penalty kl_ctl, with ppo's GAE; a job type that needs them first, as distill's advantages, recomputes
    anyway); no active dropout in the trained model (`dropout`: a training-mode forward draws its own masks)."""
    return (recomputes_logprobs(actor) and actor.ppo_n_minibatches == 1 and actor.ppo_epochs == 1
            and actor.kl_ctl == 0 and not dropout)


def approximates_proximal(actor: ActorConfig) -> bool:
    """Whether the decoupled loss's proximal log-probs are loglinear's approximation, not recomputed ones."""
    return actor.use_decoupled_loss and actor.prox_logp_method == "loglinear"


def optimizer_steps_per_step(actor: ActorConfig) -> int:
    """The optimizer steps of one training step (ppo_n_minibatches, ppo_epochs times): what the learning-rate
    schedule's length counts per step."""
    return actor.ppo_n_minibatches * actor.ppo_epochs


def kl_terms_on(actor: ActorConfig) -> bool:
    """Whether a KL term is on (the reward penalty actor.kl_ctl, the loss term actor.kl_loss_coef): a job type with
    KL terms then computes reference log-probs (rlkit.jobs.base.JobType.needs_reference). One place, so a new KL knob
    is a one-line change."""
    return actor.kl_ctl > 0 or actor.kl_loss_coef > 0

"""The trained model's section (`actor`): model, optimizer, micro-batching, and the PPO/GRPO knobs.

Kept apart from rlkit.config.schema so that each file stays one screenful of fields; field names follow AReaL.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.fields import _f, _sub


@dataclass
class MicroBatchSpec:
    """How a minibatch is split into micro-batches for forward/backward."""

    n_mbs: int = _f(1, "Fewest micro-batches per minibatch.")
    max_tokens_per_mb: int | None = _f(None, "Most tokens per micro-batch (more micro-batches when needed).")


@dataclass
class OptimizerConfig:
    """The trainer's optimizer and learning-rate schedule."""

    type: str = _f("adam", "Optimizer. Choices: adam (AdamW), sgd.")
    lr: float = _f(2e-5, "Peak learning rate.")
    weight_decay: float = _f(0.05, "Weight decay.")
    beta1: float = _f(0.9, "Adam beta1.")
    beta2: float = _f(0.95, "Adam beta2.")
    eps: float = _f(1e-5, "Adam epsilon.")
    lr_scheduler_type: str = _f("constant", "Schedule after warmup. Choices: constant, linear, cosine.")
    warmup_steps_proportion: float = _f(0.001, "Fraction of the total steps spent warming up linearly.")
    min_lr_ratio: float = _f(0.0, "Final learning rate as a fraction of lr (linear and cosine).")
    gradient_clipping: float = _f(1.0, "Clip the global gradient norm to this; 0 disables clipping.")


@dataclass
class NormConfig:
    """Advantage normalisation: subtract a mean and divide by a std, each over the batch, the group, or none."""

    mean_level: str = _f("group", "Where the mean is taken. Choices: batch, group, none.")
    std_level: str = _f("group", "Where the std is taken. Choices: batch, group, none.")
    mean_leave1out: bool = _f(False, "Leave each sample out of its own mean (RLOO).")
    eps: float = _f(1e-5, "Added to the std before dividing.")


@dataclass
class ActorConfig:
    """The policy model and how it is trained (PPO/GRPO actor)."""

    path: str = _f("", "Hugging Face model directory (weights + tokenizer).")
    dtype: str = _f("bfloat16", "Parameter dtype in training. Choices: bfloat16, float16, float32.")
    gradient_checkpointing: bool = _f(True, "Recompute activations in backward to save memory.")
    attn_impl: str = _f("flash_attention_2", "Attention kernel; falls back to sdpa when flash-attn is not installed.")
    mb_spec: MicroBatchSpec = _sub(MicroBatchSpec, "Micro-batching.")
    optimizer: OptimizerConfig = _sub(OptimizerConfig, "Optimizer.")
    weight_update_mode: str = _f(
        "disk", "How new weights reach the servers. Choices: disk (a Hugging Face checkpoint on the shared filesystem "
        "that every server reloads), xccl (broadcast from trainer rank 0 to every server's workers: NCCL on GPUs, "
        "gloo on the CPU).")
    weight_chunked_mem_mb: int = _f(
        1024, "xccl: full tensors are gathered and broadcast in buckets of about this many MiB, which bounds the "
        "trainer's extra memory during a push.")
    weight_update_timeout: float = _f(
        600.0, "Seconds any one part of a weight push may take (a server's reload, joining the broadcast group, one "
        "bucket); a server that takes longer is named and the push fails instead of hanging.")
    weight_check_tolerance: float | None = _f(
        None, "Largest mean |logprob difference| between a server and the trainer on the probe sequence after a "
        "weight update; None: 1e-3 for float32 servers, 0.1 otherwise.")
    logprob_mismatch_warn: float | None = _f(
        None, "Warn (trainer log, rlkit status) when a server's mean |logprob difference| from the trainer over a "
        "step's rollout tokens sampled at the current weight version exceeds this; None: 1e-2 when servers and "
        "trainer run float32, 0.1 otherwise.")
    group_size: int = _f(1, "Completions per prompt in one GRPO group (set it equal to gconfig.n_samples).")
    ppo_n_minibatches: int = _f(4, "Optimizer steps per training step (the batch is split into this many).")
    eps_clip: float = _f(0.2, "Clip range of the policy ratio (lower side when eps_clip_higher is set).")
    eps_clip_higher: float | None = _f(None, "Upper clip range (DAPO clip-higher); None: eps_clip.")
    c_clip: float | None = _f(None, "Dual-clip bound for negative advantages (> 1); None: off.")
    reward_scaling: float = _f(1.0, "Multiply rewards by this (after the bias).")
    reward_bias: float = _f(0.0, "Add this to rewards.")
    reward_clip: float = _f(20.0, "Clip shaped rewards to [-reward_clip, reward_clip].")
    overlong_reward_penalty: bool = _f(False, "Penalise completions that run into the last overlong_tokens tokens.")
    overlong_tokens: int | None = _f(None, "Length of the soft-penalty zone before max_new_tokens.")
    overlong_penalty_factor: float | None = _f(None, "Largest penalty, reached at max_new_tokens.")
    mask_no_eos_with_zero: bool = _f(False, "Drop completions cut at max_new_tokens from the loss.")
    kl_ctl: float = _f(0.0, "Weight of the KL penalty to the frozen reference model; 0: no reference model.")
    kl_estimator: str = _f("k1", "KL estimator. Choices: k1, k2, k3.")
    adv_norm: NormConfig = _sub(NormConfig, "Advantage normalisation.")
    importance_sampling_level: str = _f("token", "Policy ratio per token, or per sequence (GSPO).")
    use_decoupled_loss: bool = _f(False, "Decoupled PPO: weight by pi_prox/pi_behav for stale samples.")
    behav_imp_weight_cap: float | None = _f(None, "Drop tokens whose behaviour importance weight exceeds this.")
    dynamic_sampling: bool = _f(False, "Drop groups whose rewards are all equal (no learning signal, DAPO).")
    recompute_logprob: bool = _f(True, "Recompute log-probs with the trainer's weights before the update "
                                 "(else use the servers' log-probs as the old policy).")
    # ---- LoRA (peft): only the adapters train, and only the adapters go to the servers ----
    use_lora: bool = _f(False, "Train LoRA adapters (peft) instead of every weight; the servers get the adapters "
                        "only (vLLM runtime LoRA loading, a new adapter name per weight version).")
    lora_rank: int = _f(32, "LoRA rank r (the servers are started with --max-lora-rank of at least this).")
    lora_alpha: int = _f(16, "LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.")
    target_modules: list[str] = _f([], "Module names that get adapters, e.g. [q_proj, k_proj, v_proj, o_proj]; "
                                   "'all-linear' for every linear layer but the output head.")
    peft_type: str = _f("lora", "peft method. Choices: lora.")

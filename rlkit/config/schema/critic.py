"""The PPO critic's section (`critic`, AReaL's PPOCritic): a value head over a causal-LM backbone, trained by its
own optimizer beside the actor and checkpointed with it.

Field names and defaults follow AReaL (`eps_clip` 0.5 is the value-clip range AReaL passes to its critic loss as
`value_eps_clip`, verl's `cliprange_value`); an empty `path` falls back to `actor.path` as Trinity-RFT's
`critic_model_path` does. The return discount and GAE's lambda belong to the actor section (AReaL keeps them there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.config.schema.actor import FsdpConfig, MicroBatchSpec, OptimizerConfig
from rlkit.config.schema.fields import _f, _sub


def _critic_optimizer() -> OptimizerConfig:
    """A critic usually learns faster than its actor: verl's and Trinity-RFT's examples use 1e-5."""
    return OptimizerConfig(lr=1e-5)


@dataclass
class CriticConfig:
    """The value model of job type ppo: one value per token, trained on returns with a clipped value loss."""

    path: str = _f("", "Hugging Face model directory the critic starts from (a causal LM: its backbone is kept and "
                       "a fresh value head added; or a saved critic); empty: actor.path.")
    dtype: str = _f("bfloat16", "Parameter dtype in training. Choices: bfloat16, float16, float32.")
    gradient_checkpointing: bool = _f(True, "Recompute activations in backward to save memory.")
    disable_dropout: bool = _f(False, "Build the critic with every dropout of its config.json at 0.")
    attn_impl: str = _f("flash_attention_2", "Attention kernel; falls back to sdpa when flash-attn is not installed.")
    mb_spec: MicroBatchSpec = _sub(MicroBatchSpec, "How a minibatch is split into micro-batches (memory, not the "
                                                   "update).")
    fsdp: FsdpConfig = _sub(FsdpConfig, "How the trainer's ranks share the critic (AReaL's critic has its own fsdp "
                                        "section); its ulysses_sp_size must equal actor.fsdp.ulysses_sp_size: one "
                                        "trainer process runs both models over the same sequence split.")
    optimizer: OptimizerConfig = field(
        default_factory=_critic_optimizer, metadata={"help": "Optimizer of the critic (its own learning rate and "
                                                             "schedule)."})
    ppo_n_minibatches: int = _f(4, "Critic optimizer steps per training step (the batch is split into this many).",
                                ge=1)
    ppo_epochs: int | None = _f(None, "Passes of the critic over a training step's batch (its ppo_n_minibatches "
                                "steps repeated over the same minibatches); None: actor.ppo_epochs, as verl's "
                                "critic.ppo_epochs.", ge=1)
    eps_clip: float = _f(0.5, "Value clip: a new value may move at most this far from the value at rollout time "
                              "before its loss stops pulling (the larger of clipped and unclipped loss counts).")
    mask_no_eos_with_zero: bool = _f(False, "Drop completions cut at max_new_tokens from the value loss.")

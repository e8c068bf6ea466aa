"""The `distill` section: job type distill, on-policy distillation from a teacher served as an auxiliary model.

The student samples as in grpo; a teacher (one `auxiliary_models` entry, named by `teacher`) scores every sampled
token through its server's prompt-logprob route; the student learns the per-token reverse KL to the teacher (as a
per-token advantage, rlkit.trainer.rl_math.distill says why), optionally a top-k forward KL with a tail bucket, alone
(`rl_coef: 0`, rewards only logged) or added to the GRPO objective.

Names from the seeds: cosmos-rl's `distillation` (kl_penalty_coef -> coef, kl_discount_factor -> discount, top_k ->
topk), AReaL's `teacher` (distill_loss_weight -> coef, rl_loss_weight -> rl_coef) and `actor.self_distillation`
(distillation_topk -> topk, distillation_add_tail -> add_tail, is_clip -> is_clip); rlkit.config.areal.keys maps them.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f


@dataclass
class DistillConfig:
    """Job type distill: the teacher, the weights of the distillation terms and of the RL loss."""

    teacher: str = _f("teacher", "Name of the auxiliary_models entry that serves the teacher (vLLM or SGLang); its "
                                 "tokenizer must be the student's (refused at submit otherwise).")
    coef: float = _f(1.0, "Weight of the per-token reverse KL to the teacher, taken as the advantage "
                          "-coef * (log p_student - log p_teacher) of each sampled token (cosmos-rl's "
                          "kl_penalty_coef, AReaL's distill_loss_weight).", ge=0)
    discount: float = _f(0.0, "Discount of later tokens' reverse KL added to a token's advantage (cosmos-rl's "
                              "kl_discount_factor): 0 scores each token alone, 1 the whole rest of the completion.",
                         ge=0, le=1)
    rl_coef: float = _f(0.0, "Weight of the GRPO advantages from reward.fn added to the distillation advantages "
                             "(AReaL's rl_loss_weight); 0: the reward is only logged (reward.fn may be 'none').",
                        ge=0)
    topk: int | None = _f(None, "Teacher top-k log-probs per position for an extra forward-KL term over the teacher's "
                                "top-k tokens (AReaL's distillation_topk, cosmos-rl's top_k); None: off. vLLM "
                                "teachers answer at most --max-logprobs (20 by default).", ge=1, le=64)
    add_tail: bool = _f(True, "With topk: one more bucket holding the probability outside the teacher's top-k, on "
                              "both sides (AReaL's distillation_add_tail).")
    topk_coef: float = _f(1.0, "Weight of the top-k forward-KL loss term (added to the policy loss).", ge=0)
    is_clip: float | None = _f(None, "Upper bound of the importance weight pi_train / pi_behaviour applied to the "
                                     "top-k term's tokens (AReaL's is_clip); None: no weight (the term is taken "
                                     "as on-policy).", gt=0)
    request_batch: int = _f(8, "Sequences per scoring request to a teacher server (one prompt-logprob request of a "
                               "batch of prompts); requests go to the teacher's servers side by side.", ge=1, le=256)

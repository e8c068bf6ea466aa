"""The SFT loss: NLL sums over target tokens, their counts, collation and metrics, against hand computations."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rlkit.config.schema.actor import ActorConfig
from rlkit.jobs.sft.algorithm import SFT
from rlkit.jobs.sft.data import SFTExample, plaintext_example
from rlkit.jobs.sft.loss import collate, eval_nll, sequence_ppl, sft_loss_fn, sft_metrics, sft_nll
from rlkit.trainer.rl_math.losses import next_token_logprobs


class Bigram(nn.Module):
    """A real (tiny) causal LM: next-token logits from the current token only; returns `.logits` like HF models."""

    def __init__(self, vocab: int = 7) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool) -> nn.Module:
        out = nn.Module()
        out.logits = self.table(input_ids)  # type: ignore[assignment]
        return out


def test_collate_shifts_the_mask_to_next_token_positions_and_pads() -> None:
    mb = collate([SFTExample([5, 6, 7], [0, 1, 1]), SFTExample([1, 2, 3, 4, 5], [0, 0, 0, 1, 1])], pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert mb.loss_mask.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert mb.n_tokens == 4
    dummy = collate([SFTExample([5, 6, 7], [0, 1, 1])], pad_id=0, dummy=True)
    assert dummy.n_tokens == 0 and not dummy.loss_mask.any()
    with pytest.raises(ValueError):
        collate([], pad_id=0)


def test_nll_is_the_hand_computed_sum_over_masked_tokens() -> None:
    # one row of 3 tokens over a vocabulary of 2; logits at positions 0 and 1 predict tokens 1 and 2
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [9.0, 9.0]]])
    ids = torch.tensor([[0, 1, 0]])
    logp = next_token_logprobs(logits, ids)
    assert logp[0].tolist() == pytest.approx([math.log(3 / 4), math.log(4 / 5)])
    total, n = sft_nll(logp, torch.tensor([[True, True]]))
    assert n == 2 and float(total) == pytest.approx(-math.log(3 / 4) - math.log(4 / 5))
    total, n = sft_nll(logp, torch.tensor([[False, True]]))
    assert n == 1 and float(total) == pytest.approx(-math.log(4 / 5))


def test_loss_fn_sums_split_micro_batches_to_the_whole_batch_mean_and_dummies_add_nothing() -> None:
    model = Bigram()
    rows = [SFTExample([1, 2, 3, 4], [0, 0, 1, 1]), SFTExample([2, 5, 6], [0, 1, 1]), SFTExample([3, 3], [0, 1])]
    whole_sum, whole_n, stats = sft_loss_fn(model, collate(rows, pad_id=0))
    parts = [sft_loss_fn(model, collate([r], pad_id=0)) for r in rows]
    assert whole_n == 5 == sum(p[1] for p in parts) and stats["tokens"] == 5.0
    assert float(whole_sum.detach()) == pytest.approx(sum(float(p[0].detach()) for p in parts), rel=1e-6)
    table = torch.log_softmax(model.table.weight.detach(), dim=-1)
    by_hand = -sum(float(table[prev, nxt]) for prev, nxt in [(2, 3), (3, 4), (2, 5), (5, 6), (3, 3)])
    assert float(whole_sum.detach()) == pytest.approx(by_hand, rel=1e-6)
    evaluated = eval_nll(model, collate(rows, pad_id=0))
    assert (evaluated["nll_sum"], evaluated["tokens"], evaluated["seqs"]) == (pytest.approx(by_hand, rel=1e-6), 5, 3)

    loss, n, _ = sft_loss_fn(model, collate(rows[:1], pad_id=0, dummy=True))
    loss.backward()  # a dummy still reaches the parameters (FSDP's backward collectives run) with zero gradient
    assert n == 0 and float(loss.detach()) == 0.0
    assert model.table.weight.grad is not None and not model.table.weight.grad.any()


def test_ppl_is_areal_s_mean_over_sequences_of_exp_per_sequence_nll() -> None:
    """Two sequences of different lengths over a vocabulary of 2, logits chosen so each next-token probability is
    exact: row 0 predicts 3 targets with p 3/4, 1/2, 1/2 (NLL sum log 16/3, mean NLL log(16/3)/3), row 1 one target
    (of 2 positions, the first masked) with p 1/5 (NLL log 5).
      ppl (AReaL) = (exp(log(16/3) / 3) + exp(log 5)) / 2 = ((16/3)^(1/3) + 5) / 2 = 3.3735...
      exp(token-mean NLL) = exp((log(16/3) + log 5) / 4) = (80/3)^(1/4) = 2.2724... (the old `ppl`)
    The loss stays the token mean: (log(16/3) + log 5) / 4."""
    q = math.log(3.0)
    logits = torch.tensor([[[0.0, q], [0.0, 0.0], [0.0, 0.0], [9.0, 9.0]],
                           [[0.0, 0.0], [math.log(4.0), 0.0], [9.0, 9.0], [9.0, 9.0]]])
    ids = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]])
    logp = next_token_logprobs(logits, ids)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    assert logp[0].tolist() == pytest.approx([math.log(3 / 4), math.log(1 / 2), math.log(1 / 2)])
    assert float(logp[1, 1]) == pytest.approx(math.log(1 / 5))
    nll_sum, tokens = sft_nll(logp, mask)
    ppl_sum, seqs = sequence_ppl(logp, mask)
    m = sft_metrics({"nll_sum": float(nll_sum), "tokens": tokens, "ppl_sum": ppl_sum, "seqs": seqs})
    assert m["sft/ppl"] == pytest.approx(((16 / 3) ** (1 / 3) + 5) / 2, rel=1e-6)  # float32 logits
    assert m["sft/loss"] == pytest.approx((math.log(16 / 3) + math.log(5)) / 4, rel=1e-6)
    assert math.exp(m["sft/loss"]) == pytest.approx((80 / 3) ** 0.25, rel=1e-6)  # what `ppl` was: another number
    assert m["sft/tokens"] == 4.0


def test_metrics_of_nothing_are_nan_and_dummy_rows_take_no_part_in_ppl() -> None:
    assert sequence_ppl(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)) == (0.0, 0)
    empty = sft_metrics(dict.fromkeys(("nll_sum", "tokens", "ppl_sum", "seqs"), 0.0), prefix="eval")
    assert math.isnan(empty["eval/loss"]) and math.isnan(empty["eval/ppl"])


class CharTokenizer:
    """a..e are tokens 1..5, EOS is 6: enough of a tokenizer for raw-text rows."""

    eos_token_id = 6

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + "abcde".index(c) for c in text]


def test_an_empty_prompt_s_first_token_is_no_target_and_the_step_loss_is_the_mean_over_predicted_tokens() -> None:
    """An empty raw-text prompt: the response's first token has nothing before it, so it is no target. The step's
    loss (the engine weighs each micro-batch's mean by its tokens over the step's count) is the mean NLL over exactly
    the 5 predicted tokens; before, position 0 was counted (6) and the loss came out 5/6 of it."""
    empty = plaintext_example("", "abc", CharTokenizer(), apply_chat_template=False)
    assert (empty.input_ids, empty.loss_mask, empty.n_targets) == ([1, 2, 3, 6], [0, 1, 1, 1], 3)
    rows = [empty, plaintext_example("ab", "c", CharTokenizer(), apply_chat_template=False)]
    owner = SimpleNamespace(config=SimpleNamespace(actor=ActorConfig()), rank=0, world=1, pad_id=0,
                            device=torch.device("cpu"), engine=SimpleNamespace(data_rank_world=(0, 1)))
    micro, step_tokens, _ = SFT._micro_batches(owner, rows, [0, 1])  # type: ignore[arg-type]
    model = Bigram()
    step_loss = 0.0
    for mb in micro:  # TrainEngine.optimizer_step's weighting, world 1
        nll_sum, n_tokens, _ = sft_loss_fn(model, mb)
        step_loss += float(nll_sum.detach()) / max(1, n_tokens) * n_tokens / step_tokens
    table = torch.log_softmax(model.table.weight.detach(), dim=-1)
    predicted = [(1, 2), (2, 3), (3, 6), (2, 3), (3, 6)]
    assert step_tokens == 5
    assert step_loss == pytest.approx(-sum(float(table[a, b]) for a, b in predicted) / 5, rel=1e-6)

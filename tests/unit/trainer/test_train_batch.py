"""Hand-computed cases for packing samples into micro-batch tensors, micro-batch splitting, dummies."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.batch import dummy_like, pack, split_micro_batches
from rlkit.trainer.rl_math.advantage_batch import prepare_batch
from rlkit.types import Sample

PAD = 99


def sample(prompt: list[int], completion: list[int], logp: list[float] | None = None, *, advantage: float = 0.0,
           finished: bool = True, group: int = 0) -> Sample:
    return Sample(prompt_ids=prompt, completion_ids=completion,
                  behav_logp=logp if logp is not None else [-0.5] * len(completion), reward=1.0, version=3,
                  finished=finished, group=group, advantage=advantage)


def of_length(length: int, tag: int) -> Sample:
    """A sample of `length` tokens (one prompt token); `tag` identifies it via `group`."""
    return sample([tag], [tag] * (length - 1), group=tag)


def tags(mbs: list[list[Sample]]) -> list[list[int]]:
    return [[s.group for s in mb] for mb in mbs]


# --- pack -------------------------------------------------------------------------------------------------------

# A: prompt of 3 tokens, completion of 2 -> completion positions 2, 3 of the [B, L-1] tensors (L = 5).
# B: prompt of 1 token, completion of 3 -> positions 0, 1, 2; one pad token at the end of input_ids.
A = dict(prompt=[1, 2, 3], completion=[4, 5], logp=[-0.1, -0.2], advantage=0.5)
B = dict(prompt=[7], completion=[8, 9, 10], logp=[-1.0, -2.0, -3.0], advantage=-1.0)


def two(*, b_finished: bool = True) -> list[Sample]:
    return [sample(A["prompt"], A["completion"], A["logp"], advantage=A["advantage"]),  # type: ignore[arg-type]
            sample(B["prompt"], B["completion"], B["logp"], advantage=B["advantage"],  # type: ignore[arg-type]
                   finished=b_finished)]


def test_pack_places_completion_tokens_at_prompt_len_minus_one_plus_j() -> None:
    mb = pack(two(), PAD)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 10, PAD]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert mb.loss_mask.shape == (2, 4) and mb.loss_mask.dtype == torch.bool
    assert mb.loss_mask.tolist() == [[False, False, True, True], [True, True, True, False]]
    torch.testing.assert_close(mb.behav_logp, torch.tensor([[0.0, 0.0, -0.1, -0.2], [-1.0, -2.0, -3.0, 0.0]]))
    torch.testing.assert_close(mb.advantages, torch.tensor([[0.0, 0.0, 0.5, 0.5], [-1.0, -1.0, -1.0, 0.0]]))
    assert mb.n_tokens == 5
    # position p predicts token p + 1: the masked next tokens are exactly the completions, in order
    assert mb.input_ids[:, 1:][mb.loss_mask].tolist() == [4, 5, 8, 9, 10]


def test_pack_mask_truncated_drops_unfinished_samples_only_when_asked() -> None:
    kept = pack(two(b_finished=False), PAD)
    assert kept.loss_mask.tolist() == [[False, False, True, True], [True, True, True, False]]
    assert kept.n_tokens == 5
    masked = pack(two(b_finished=False), PAD, mask_truncated=True)
    assert masked.loss_mask.tolist() == [[False, False, True, True], [False, False, False, False]]
    assert masked.n_tokens == 2
    # the finished flag alone (without mask_truncated) changes nothing; finished samples are never masked
    assert pack(two(), PAD, mask_truncated=True).n_tokens == 5


def test_pack_dummy_runs_but_never_counts() -> None:
    a, b = two()
    mb = pack([a, dummy_like(b)], PAD)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 10, PAD]]  # still forwarded
    assert mb.loss_mask.tolist() == [[False, False, True, True], [False, False, False, False]]
    assert mb.advantages[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert mb.n_tokens == 2
    only = pack([dummy_like(a)], PAD)
    assert only.n_tokens == 0 and not bool(only.loss_mask.any())


def test_pack_single_sample_has_no_padding() -> None:
    mb = pack([sample([5, 6], [7], [-0.25], advantage=2.0)], PAD)
    assert mb.input_ids.tolist() == [[5, 6, 7]]
    assert mb.attention_mask.tolist() == [[1, 1, 1]]
    assert mb.loss_mask.tolist() == [[False, True]]
    assert mb.behav_logp.tolist() == [[0.0, -0.25]]
    assert mb.advantages.tolist() == [[0.0, 2.0]]
    assert mb.n_tokens == 1


def test_pack_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="empty"):
        pack([], PAD)


def test_a_batch_with_misaligned_per_token_lists_never_reaches_pack() -> None:
    """The check pack relies on runs once, where the batch enters the trainer (prepare_batch): one log-prob for three
    tokens would otherwise broadcast silently in pack's tensors."""
    one_logp = sample([1], [2, 3, 4], [-1.0])
    with pytest.raises(ValueError, match="sample 1: 1 log-probs for 3 tokens"):
        prepare_batch([[sample([1], [2]), one_logp]], ActorConfig(group_size=2), max_new_tokens=8)
    a, b = two()
    b.token_advantages = [0.25, -0.5]
    with pytest.raises(ValueError, match="sample 1: 2 advantages for 3 tokens"):
        prepare_batch([[a, b]], ActorConfig(group_size=2), max_new_tokens=8)


def test_pack_places_per_token_advantages_where_set() -> None:
    """token_advantages (KL reward penalty, GAE, adv_norm) replace the sequence advantage on that sample only."""
    a, b = two()
    b.token_advantages = [0.25, -0.5, 1.5]
    mb = pack([a, b], PAD)
    torch.testing.assert_close(mb.advantages, torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.25, -0.5, 1.5, 0.0]]))
    assert dummy_like(b).token_advantages is None  # a dummy never carries a signal


# --- split_micro_batches ----------------------------------------------------------------------------------------

def test_split_without_token_bound_respects_min_count_and_order() -> None:
    items = [of_length(3, t) for t in range(7)]
    assert tags(split_micro_batches(items, max_tokens=None)) == [[0, 1, 2, 3, 4, 5, 6]]
    assert tags(split_micro_batches(items, max_tokens=None, min_count=3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert tags(split_micro_batches(items, max_tokens=None, min_count=7)) == [[0], [1], [2], [3], [4], [5], [6]]
    # more micro-batches asked for than samples: one sample each
    assert tags(split_micro_batches(items[:2], max_tokens=None, min_count=5)) == [[0], [1]]
    assert split_micro_batches([], max_tokens=None, min_count=4) == []


@pytest.mark.parametrize("max_tokens", [None, 1000])
@pytest.mark.parametrize(("n", "min_count"), [(5, 4), (6, 4), (7, 5), (10, 4)])
def test_split_gives_at_least_min_count(n: int, min_count: int, max_tokens: int | None) -> None:
    items = [of_length(2, t) for t in range(n)]
    mbs = split_micro_batches(items, max_tokens=max_tokens, min_count=min_count)
    assert len(mbs) >= min_count
    assert [s.group for mb in mbs for s in mb] == list(range(n))
    assert all(mbs)


def test_split_five_into_four_exactly() -> None:
    items = [of_length(2, t) for t in range(5)]
    assert tags(split_micro_batches(items, max_tokens=None, min_count=4)) == [[0, 1], [2], [3], [4]]
    assert tags(split_micro_batches(items, max_tokens=100, min_count=4)) == [[0, 1], [2], [3], [4]]


def test_split_token_bound_is_batch_size_times_longest() -> None:
    # lengths 4, 6, 2, 5, 5 with max_tokens 12:
    # [4] -> [4, 6] costs 2 * 6 = 12 <= 12 -> + 2 would cost 3 * 6 = 18 > 12 -> new [2]
    # [2, 5] costs 10 -> + 5 would cost 15 > 12 -> new [5]
    items = [of_length(n, t) for t, n in enumerate([4, 6, 2, 5, 5])]
    mbs = split_micro_batches(items, max_tokens=12)
    assert tags(mbs) == [[0, 1], [2, 3], [4]]
    for mb in mbs:
        assert len(mb) * max(s.length for s in mb) <= 12


def test_split_oversize_sample_gets_its_own_micro_batch() -> None:
    items = [of_length(n, t) for t, n in enumerate([3, 3, 50, 3, 3])]
    assert tags(split_micro_batches(items, max_tokens=10)) == [[0, 1], [2], [3, 4]]
    assert tags(split_micro_batches([of_length(50, 0)], max_tokens=10)) == [[0]]


def test_split_token_bound_and_min_count_together() -> None:
    # the token bound alone would allow 4 per micro-batch (4 * 3 = 12); min_count=3 caps them at ceil(6/3) = 2
    items = [of_length(3, t) for t in range(6)]
    assert tags(split_micro_batches(items, max_tokens=12)) == [[0, 1, 2, 3], [4, 5]]
    assert tags(split_micro_batches(items, max_tokens=12, min_count=3)) == [[0, 1], [2, 3], [4, 5]]


# --- dummy_like -----------------------------------------------------------------------------------------------

def test_dummy_like_keeps_tokens_and_zeroes_the_signal() -> None:
    src = sample([1, 2], [3, 4], [-0.5, -0.7], advantage=1.5, finished=False, group=7)
    d = dummy_like(src)
    assert d.dummy and not src.dummy
    assert (d.prompt_ids, d.completion_ids, d.behav_logp) == ([1, 2], [3, 4], [-0.5, -0.7])
    assert (d.reward, d.advantage, d.version, d.group, d.finished) == (0.0, 0.0, 3, 7, True)
    assert d.length == 4

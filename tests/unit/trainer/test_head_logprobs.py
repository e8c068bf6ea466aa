"""Log-probs through the output head in chunks (rlkit.trainer.head_logprobs) against the full logits, on the tiny
Qwen2 model in float32: the log-probs, the entropies and the gradient of every parameter agree within 1e-5
(relative) for an untied head, a head tied to the input embedding and LoRA models (attention adapters, an adapted
head); the head only ever sees `chunk_tokens` rows, also when backward recomputes; the job types' loss functions
take the chunked path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from rlkit.config.schema.actor import ActorConfig
from rlkit.jobs.pairs.batch import pack_pairs
from rlkit.jobs.pairs.data import Pair
from rlkit.jobs.pairs.loss_fns import answer_logps
from rlkit.jobs.sft.data import SFTExample
from rlkit.jobs.sft.loss import collate, sft_loss_fn
from rlkit.models.packing import set_packing
from rlkit.trainer.engine import load_causal_lm
from rlkit.trainer.head_logprobs import chunked_logprobs, model_token_logprobs, output_head
from rlkit.trainer.lora import wrap_lora

RTOL = 1e-5
# an adapter on a head tied to the input embedding is what this file checks on purpose
pytestmark = pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
Result = tuple[Tensor, Tensor | None, dict[str, Tensor]]


def head_of(model: nn.Module) -> nn.Module:
    head = output_head(model)
    assert head is not None
    return head


def assert_relative(got: Tensor, want: Tensor, what: str) -> None:
    """|got - want| at most RTOL of want's largest magnitude (element-wise relative error is meaningless at 0)."""
    got, want = got.detach(), want.detach()
    scale = float(want.abs().max())
    error = float((got - want).abs().max())
    assert scale > 0, f"{what}: all zeros, nothing compared"
    assert error <= RTOL * scale, f"{what}: max |difference| {error:.3g} > {RTOL:g} x {scale:.3g}"


def _causal_lm(path: Path) -> nn.Module:
    return load_causal_lm(str(path), dtype=torch.float32, attn_impl="sdpa", disable_dropout=True)


def _lora(path: Path, targets: list[str]) -> nn.Module:
    """A peft model whose adapters are not zero (peft starts B at 0, which would leave A without gradient)."""
    model = wrap_lora(_causal_lm(path), ActorConfig(path=str(path), use_lora=True, lora_rank=4, lora_alpha=8,
                                                    target_modules=targets))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    return model


MODELS: dict[str, Callable[[Path, Path], nn.Module]] = {
    "untied": lambda untied, tied: _causal_lm(untied),
    "tied": lambda untied, tied: _causal_lm(tied),
    "lora": lambda untied, tied: _lora(untied, ["q_proj", "v_proj"]),
    "lora-head-tied": lambda untied, tied: _lora(tied, ["q_proj", "lm_head"]),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest, tiny_model_dir: Path, tied_model_dir: Path) -> nn.Module:
    return MODELS[request.param](tiny_model_dir, tied_model_dir)


def _batch(vocab: int) -> tuple[Tensor, Tensor]:
    """Three right-padded rows of 13 tokens: 36 positions, so a chunk of 5 leaves a last chunk of 1."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 13), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    return ids, mask


def _run(model: nn.Module, ids: Tensor, mask: Tensor, *, chunk: int, temperature: float) -> Result:
    """Log-probs, entropies and every trainable parameter's gradient of a loss that weighs each position
    differently (so a position mixed up with another would show)."""
    model.zero_grad(set_to_none=True)
    logp, entropy = model_token_logprobs(model, ids, mask, temperature=temperature, chunk_tokens=chunk,
                                         with_entropy=True)
    weights = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)
    (logp * weights * mask[:, 1:]).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, grads


@pytest.mark.parametrize(("chunk", "temperature"), [(5, 1.0), (7, 0.7), (1000, 1.3)])
def test_chunked_equals_full_logits(model: nn.Module, chunk: int, temperature: float) -> None:
    ids, mask = _batch(model.config.vocab_size)
    full_logp, full_entropy, full_grads = _run(model, ids, mask, chunk=0, temperature=temperature)
    logp, entropy, grads = _run(model, ids, mask, chunk=chunk, temperature=temperature)
    assert logp.shape == entropy.shape == full_logp.shape == (3, 12)  # type: ignore[union-attr]
    assert_relative(logp, full_logp, "log-probs")
    assert entropy is not None and full_entropy is not None
    assert_relative(entropy, full_entropy, "entropies")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(grads) == set(full_grads) == trainable
    for name, grad in full_grads.items():
        assert_relative(grads[name], grad, f"gradient of {name}")


def test_lora_trains_only_its_adapters_on_the_chunked_path(tiny_model_dir: Path, tied_model_dir: Path) -> None:
    model = _lora(tied_model_dir, ["q_proj", "lm_head"])
    ids, mask = _batch(model.config.vocab_size)
    _, _, grads = _run(model, ids, mask, chunk=4, temperature=1.0)
    assert grads and all("lora_" in name for name in grads)
    assert any("lm_head" in name for name in grads)  # the adapted head is what each chunk called


class HeadSpy:
    """Stands in as an instance-level forward of the head (as accelerate's hooks do): records each call's rows."""

    def __init__(self, head: nn.Module) -> None:
        self.own, self.rows = head.forward, []  # type: ignore[var-annotated]

    def __call__(self, hidden: Tensor) -> Tensor:
        self.rows.append(hidden.shape[:-1].numel())
        return self.own(hidden)


def test_the_head_sees_one_chunk_at_a_time_in_forward_and_backward(tiny_model_dir: Path) -> None:
    model = _causal_lm(tiny_model_dir)
    set_packing(model, False)  # the padded rows' 36 positions (packed: tests/unit/trainer/test_packed_forward.py)
    head = head_of(model)
    spy = HeadSpy(head)
    head.forward = spy
    ids, mask = _batch(model.config.vocab_size)
    logp, entropy = model_token_logprobs(model, ids, mask, chunk_tokens=8, with_entropy=False)
    assert entropy is None
    assert spy.rows == [8, 8, 8, 8, 4]  # 36 positions
    logp.sum().backward()
    assert spy.rows[5:] == [4, 8, 8, 8, 8]  # backward recomputed every chunk, one at a time, last first
    assert head.forward is spy  # the instance-level forward is back

    spy.rows.clear()
    with torch.no_grad():  # the reference's and the evaluator's forwards: no checkpoint, no recompute
        model_token_logprobs(model, ids, mask, chunk_tokens=8)
    assert spy.rows == [8, 8, 8, 8, 4]

    spy.rows.clear()
    model_token_logprobs(model, ids, mask, chunk_tokens=0)
    assert spy.rows == [3 * 13]  # the full path: every position at once


def test_the_head_is_restored_when_the_forward_fails(tiny_model_dir: Path) -> None:
    model = _causal_lm(tiny_model_dir)
    head = head_of(model)
    ids, mask = _batch(model.config.vocab_size)

    def broken(hidden: Tensor) -> Tensor:
        raise RuntimeError("out of memory (as a chunk's logits may be)")

    head.forward = broken
    with pytest.raises(RuntimeError, match="out of memory"):
        model_token_logprobs(model, ids, mask, chunk_tokens=4)
    assert head.forward is broken
    del head.forward
    logp, _ = model_token_logprobs(model, ids, mask, chunk_tokens=4)
    assert "forward" not in head.__dict__
    assert model(input_ids=ids[:1, :3]).logits.shape == (1, 3, model.config.vocab_size)  # the class's own again
    assert logp.shape == (3, 12)


def test_a_model_that_changes_the_logits_after_its_head_takes_the_full_path(tiny_model_dir: Path) -> None:
    model = copy.deepcopy(_causal_lm(tiny_model_dir))
    set_packing(model, False)  # the head then sees the padded rows: 3 x 13
    head = head_of(model)
    model.config.final_logit_softcapping = 30.0  # Gemma's: applied by the model's forward after the head
    assert output_head(model) is None
    spy = HeadSpy(head)
    head.forward = spy
    ids, mask = _batch(model.config.vocab_size)
    model_token_logprobs(model, ids, mask, chunk_tokens=4)
    assert spy.rows == [3 * 13]


def test_chunked_logprobs_of_a_plain_head_match_log_softmax() -> None:
    torch.manual_seed(0)
    head = nn.Linear(6, 50)
    hidden, targets = torch.randn(2, 9, 6), torch.randint(0, 50, (2, 9))
    logp, entropy = chunked_logprobs(head, hidden, targets, temperature=0.5, chunk_tokens=4, with_entropy=True)
    full = torch.log_softmax(head(hidden) / 0.5, dim=-1)
    assert_relative(logp, full.gather(-1, targets[..., None]).squeeze(-1), "log-probs")
    assert entropy is not None
    assert_relative(entropy, -(full.exp() * full).sum(-1), "entropies")
    with pytest.raises(ValueError, match="at least one token"):
        chunked_logprobs(head, hidden, targets, chunk_tokens=0)


def test_sft_and_dpo_losses_take_the_chunked_path(tiny_model_dir: Path) -> None:
    model = _causal_lm(tiny_model_dir)
    set_packing(model, False)  # the padded rows' 36 positions (packed: tests/unit/trainer/test_packed_forward.py)
    head = head_of(model)
    spy = HeadSpy(head)
    head.forward = spy
    sft = collate([SFTExample(list(range(3, 15)), [0] * 4 + [1] * 8), SFTExample([5, 6, 7], [0, 1, 1])], pad_id=0)
    full, n_full, _ = sft_loss_fn(model, sft, chunk_tokens=0)
    chunked, n_chunked, _ = sft_loss_fn(model, sft, chunk_tokens=5)
    assert n_full == n_chunked == 10
    assert_relative(chunked.detach(), full.detach(), "sft NLL sum")
    assert spy.rows == [24, 5, 5, 5, 5, 2]  # 2 rows x 12 positions

    pairs = pack_pairs([Pair(3, (10, 11, 12), (20, 21), (30,)), Pair(8, (13,), (22, 23, 24), (31, 32))], pad_id=0)
    assert_relative(answer_logps(model, pairs, chunk_tokens=3).detach(),
                    answer_logps(model, pairs, chunk_tokens=0).detach(), "dpo answer log-prob sums")


def _entropy_run(model: nn.Module, ids: Tensor, mask: Tensor, *, chunk: int, temperature: float) -> Result:
    """Entropies with gradient (the entropy bonus) and every trainable parameter's gradient of a weighted sum of
    them over the real positions."""
    model.zero_grad(set_to_none=True)
    logp, entropy = model_token_logprobs(model, ids, mask, temperature=temperature, chunk_tokens=chunk,
                                         entropy_grad=True)
    assert entropy is not None and entropy.requires_grad
    weights = torch.linspace(-1.0, 2.0, entropy.numel()).view_as(entropy)
    (entropy * weights * mask[:, 1:]).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize(("chunk", "temperature"), [(5, 1.0), (7, 0.7), (1000, 1.3)])
def test_the_entropys_gradient_through_chunks_equals_the_full_logits_one(model: nn.Module, chunk: int,
                                                                        temperature: float) -> None:
    """The entropy bonus differentiates the entropy; through the chunks (recomputed in backward) it is the full
    logits' entropy, value and gradient, at the sampling temperature."""
    ids, mask = _batch(model.config.vocab_size)
    full_logp, full_entropy, full_grads = _entropy_run(model, ids, mask, chunk=0, temperature=temperature)
    logp, entropy, grads = _entropy_run(model, ids, mask, chunk=chunk, temperature=temperature)
    assert entropy is not None and full_entropy is not None
    assert_relative(logp, full_logp, "log-probs")
    assert_relative(entropy, full_entropy, "entropies")
    hand = torch.distributions.Categorical(logits=model(input_ids=ids, attention_mask=mask).logits[:, :-1].detach()
                                           / temperature).entropy()
    assert_relative(torch.where(mask[:, 1:].bool(), full_entropy, 0.0), torch.where(mask[:, 1:].bool(), hand, 0.0),
                    "entropies against torch.distributions")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(grads) == set(full_grads) == trainable
    for name, grad in full_grads.items():
        assert_relative(grads[name], grad, f"entropy gradient of {name}")


def test_without_entropy_gradient_nothing_changes(tiny_model_dir: Path) -> None:
    """The entropy as a statistic (the bonus off) carries no gradient, and the log-probs and their gradient are
    bit-identical to a call that asks for no entropy at all."""
    model = _causal_lm(tiny_model_dir)
    ids, mask = _batch(model.config.vocab_size)
    for chunk in (0, 5):
        plain = _run(model, ids, mask, chunk=chunk, temperature=0.7)
        model.zero_grad(set_to_none=True)
        logp, entropy = model_token_logprobs(model, ids, mask, temperature=0.7, chunk_tokens=chunk)
        assert entropy is None
        (logp * torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp) * mask[:, 1:]).sum().backward()
        assert plain[1] is not None and not plain[1].requires_grad
        assert torch.equal(plain[0], logp.detach())
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.equal(plain[2][name], p.grad), name


def test_the_entropy_gradient_recomputes_one_chunk_at_a_time(tiny_model_dir: Path) -> None:
    """With the entropy's gradient the head still sees one chunk at a time, in backward too."""
    model = _causal_lm(tiny_model_dir)
    set_packing(model, False)
    head = head_of(model)
    spy = HeadSpy(head)
    head.forward = spy
    ids, mask = _batch(model.config.vocab_size)
    logp, entropy = model_token_logprobs(model, ids, mask, chunk_tokens=8, entropy_grad=True)
    assert entropy is not None
    assert spy.rows == [8, 8, 8, 8, 4]
    (logp.sum() + entropy.sum()).backward()
    assert spy.rows[5:] == [4, 8, 8, 8, 8]

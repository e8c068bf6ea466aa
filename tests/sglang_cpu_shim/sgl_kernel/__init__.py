"""TEST-ONLY stand-in for ONE CUDA-only kernel, so SGLang 0.5.23's CPU engine runs on a CPU here.

What this is: not sgl-kernel. PyPI's `sglang-kernel` 0.4.10 (the one `sglang==0.5.23` pins) ships CUDA builds only;
its CPU build (the `*_cpu` ops that `SGLANG_USE_CPU_ENGINE=1 --device cpu` imports) is not on PyPI, so the server
dies at import ("Could not load any common_ops library ... libcuda.so.1"). Put this directory FIRST on the server's
PYTHONPATH and `import sgl_kernel` finds this package instead of the installed one.

It implements exactly one function, `assign_req_to_token_pool_cpu`, in plain torch: the only `*_cpu` op a plain
decode on this machine's path calls (sglang/srt/mem_cache/allocation.py: `assign_req_to_token_pool_func`, the CPU
twin of the triton kernel `assign_req_to_token_pool` in the same file, whose semantics it copies). Any other
`*_cpu` name can be imported (SGLang imports some at module level, e.g. `copy_all_layer_kv_cache_cpu` in
sglang/kernels/ops/kvcache/cache_move.py) but raises NotImplementedError when called, so a code path that needs a
real kernel fails loudly instead of computing something else. Every other name is an AttributeError (no feature
detection is fooled).

Pinned to sglang 0.5.23 (scripts/sglang-env.sh installs that version); re-check this list on any upgrade. Never
shipped in rlkit: real deployments run SGLang on GPUs with the real sgl-kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SGLANG_VERSION = "0.5.23"  # the only SGLang this stand-in was checked against


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For request i of the batch: `req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[o_i:o_i+n_i]`,
    where n_i = end[i] - start[i] and o_i is the sum of n_j for j < i (out_cache_loc holds the batch's new KV slots
    back to back). In place, as the triton kernel; `pool_len` is req_to_token's row length (unused: torch indexes
    by row)."""
    del pool_len
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        count = end - start
        if count > 0:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + count].to(req_to_token.dtype)
        offset += count


def _not_implemented(name: str) -> Callable[..., Any]:
    def kernel(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by rlkit's test-only CPU shim (tests/sglang_cpu_shim), which "
            "provides assign_req_to_token_pool_cpu only; this SGLang code path needs the real sgl-kernel CPU build"
        )

    kernel.__name__ = name
    return kernel


def __getattr__(name: str) -> Callable[..., Any]:
    """Importable placeholders for the other `*_cpu` kernels (PEP 562); AttributeError for anything else."""
    if name.endswith("_cpu") and not name.startswith("_"):
        return _not_implemented(name)
    raise AttributeError(f"module 'sgl_kernel' (rlkit's test-only CPU shim) has no attribute {name!r}")

"""vLLM worker extension for rlkit's disk weight sync: an in-place reload that keeps tied output heads right.

Loaded into every vLLM worker (all tensor-parallel ranks) by `--worker-extension-cls
rlkit.servers.vllm.worker.WeightSyncExtension` (added by `rlkit.servers.vllm.command.vllm_command`) and called
over HTTP: `POST /collective_rpc {"method": "rlkit_reload_weights", "kwargs": {"weights_path": DIR}}`.

Why plain `reload_weights` serves wrong logits for tied embeddings (read in vLLM 0.32, seen on the CPU build):

- With `tie_word_embeddings`, vLLM ties by sharing one `Parameter`: `ParallelLMHead.tie_weights` does
  `lm_head.weight = embed_tokens.weight`.
- A layer's weight is not all of its state. After loading, `quant_method.process_weights_after_loading(layer)` may
  derive kernel state from it; for the unquantized embedding method on the CPU this is `layer.cpu_linear`, a closure
  over a oneDNN handle (or an sgl-kernel packed tensor) built from a packed *copy* of the weight. Logits are
  `lm_head.cpu_linear(hidden)`: the head's `weight` attribute is not read at all.
- The in-place reload (`model_loader/reload/layerwise.py`) replaces every layer's tensors by meta tensors (which
  breaks the sharing for the duration), buffers the checkpoint tensors per layer, and only when a layer has received
  all its elements re-materialises it, runs its weight loaders and `process_weights_after_loading`, and copies the
  result into the original tensor storage. A tied checkpoint (as `save_pretrained` writes it) holds
  `model.embed_tokens.weight` only, so `lm_head` receives nothing: `finalize_layerwise_reload` just puts its old
  tensor back ("Failed to load weights" in the log). That tensor is the shared `Parameter`, whose values the
  embedding's processing has just overwritten, so a checksum of `lm_head.weight` looks new, but the head's packed
  copy is never rebuilt: the server embeds tokens with the new weights and scores them with the old ones.
  (The first load does not have the problem: `model_loader.utils.process_weights_after_loading` runs on every
  module once all weights are in.) On GPUs the unquantized head reads `weight` directly, so there is nothing stale.

`rlkit_reload_weights` runs vLLM's own reload, then for every parameter that several modules share (found before the
reload by identity, so any model that ties, on every rank's own shard): puts the canonical values back into any
member that is no longer the same tensor, and re-runs `process_weights_after_loading` on every member, as the first
load does. That is only done for the unquantized embedding method, whose processing is idempotent; a tied layer with
another quantization method raises instead of serving stale weights.

The module is imported inside vLLM workers only; vLLM and torch are imported lazily so that the rest of rlkit (and
mypy) can import it without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class TiedMember:
    """One module attribute holding a shared parameter: `module_name.attr` (e.g. `lm_head.weight`)."""

    module_name: str
    module: nn.Module
    attr: str

    @property
    def name(self) -> str:
        return f"{self.module_name}.{self.attr}" if self.module_name else self.attr


def tied_parameter_groups(model: nn.Module) -> list[list[TiedMember]]:
    """Parameters held by more than one module, as groups of members; the first member of a group is canonical.

    Modules are walked in registration order (`model.embed_tokens` comes before `lm_head`), so the canonical member is
    the one vLLM's `AutoWeightsLoader` loads and the others are its aliases.
    """
    owners: dict[int, list[TiedMember]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen:
            continue
        seen.add(id(module))
        for attr, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append(TiedMember(module_name, module, attr))
    return [members for members in owners.values() if len(members) > 1]


def refresh_tied_groups(groups: list[list[TiedMember]]) -> list[str]:
    """After an in-place reload: make every member equal to the canonical one and rebuild derived kernel state.

    Returns the names of the modules whose `process_weights_after_loading` was run again.
    """
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    refreshed: list[str] = []
    with torch.no_grad():
        for group in groups:
            canonical = getattr(group[0].module, group[0].attr)
            for member in group[1:]:
                alias = getattr(member.module, member.attr)
                if alias is canonical:
                    continue
                if alias.shape != canonical.shape:
                    raise RuntimeError(f"tied parameters {group[0].name} {tuple(canonical.shape)} and {member.name} "
                                       f"{tuple(alias.shape)} no longer have the same shape after the reload")
                alias.data.copy_(canonical.data)  # in place: keeps references captured by graphs valid
            for member in group:
                quant_method = getattr(member.module, "quant_method", None)
                if quant_method is None:
                    continue
                if not isinstance(quant_method, UnquantizedEmbeddingMethod):
                    raise RuntimeError(
                        f"{member.name} is tied ({', '.join(m.name for m in group)}) and its layer uses "
                        f"{type(quant_method).__name__}; rlkit only knows how to rebuild the derived state of "
                        "unquantized tied embeddings after a reload. Serve an untied checkpoint instead."
                    )
                quant_method.process_weights_after_loading(member.module)
                refreshed.append(member.module_name)
    return refreshed


class WeightSyncExtension:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; its methods are callable by `/collective_rpc`.

    Only `rlkit_`-prefixed names are defined here: vLLM refuses an extension whose attributes clash with the worker's.
    """

    # Provided by vLLM's Worker (annotations only: nothing is defined on this class, so nothing can clash).
    model_runner: Any
    vllm_config: Any
    rank: int
    reload_weights: Callable[..., None]

    def rlkit_reload_weights(self, weights_path: str, delta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reload the weights in place from the HF checkpoint directory `weights_path`, then refresh tied layers.

        `delta` (a run with `actor.weight_update_delta`: rlkit.servers.weight_delta.DeltaHeader as JSON): the
        worker reads the push itself, a full checkpoint or a delta against the copy it keeps, and loads the copy.

        Returns (per worker, JSON-able) the rank, the tied parameter groups found, the modules re-processed and the
        time taken.
        """
        start = time.perf_counter()
        groups = tied_parameter_groups(self.model_runner.get_model())
        if delta is None:
            self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        else:
            _reload_delta(self, Path(weights_path), delta)
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            refreshed = refresh_tied_groups(groups)
        return {
            "rank": self.rank,
            "weights_path": weights_path,
            "tied": [[member.name for member in group] for group in groups],
            "refreshed": refreshed,
            "seconds": round(time.perf_counter() - start, 4),
        }


def _reload_delta(worker: WeightSyncExtension, weights_path: Path, delta: dict[str, Any]) -> None:
    """A push of a run with deltas: read it, apply it to the copy this worker keeps (made at its first such push,
    held on the worker object), and reload the whole copy in place."""
    from rlkit.servers.weight_delta import DeltaBase, DeltaHeader, read_push

    header = DeltaHeader.from_json(delta)
    base: DeltaBase = worker.__dict__.setdefault("_rlkit_delta_base", DeltaBase())
    base.begin(header)
    complete = dict(base.take(read_push(weights_path, header)))
    missing = sorted(set(base.tensors) - set(complete))
    if missing:  # every push carries every tensor (whole or delta): a missing one means a partial push
        raise ValueError(f"push {header.id} in {weights_path} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    worker.reload_weights(weights_iterator=iter(complete.items()), is_checkpoint_format=True)
    base.commit()

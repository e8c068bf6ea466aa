"""What a wrapped model's sliced build needs beyond the plain causal LM's (rlkit.trainer.sharded_load): the checkpoint
name of each of its state-dict entries, and the values of the parameters its build draws itself.

A LoRA actor (rlkit.trainer.lora.wrap_lora) is peft's model around the causal LM: the base weights are the
checkpoint's under other names (`base_model.model.<name>`, `.base_layer.` inside each wrapped module), the adapter's
A and B are drawn by peft from a fixed seed. The names come from the skeleton itself (where peft put the base model,
which modules it wrapped), never from a list of model families. The drawn values come from the meta build itself:
peft creates each adapter layer on the CPU, draws it, and only then moves it to its base layer's (meta) device, so
the parameter objects registered on the CPU hold exactly the values rank 0's full build draws, on every rank and
for a few adapter-sized bytes. Without this, rank 0 built the whole float32 model on its host (a 70B LoRA run: 280
GB) to broadcast an adapter every rank can draw by itself.
"""

from __future__ import annotations

from types import TracebackType

import torch
from torch import Tensor, nn

BASE_LAYER = "base_layer"  # peft's name for the module a tuner layer wraps


def checkpoint_names(skeleton: nn.Module) -> tuple[nn.Module, dict[str, str]]:
    """(the model whose keys the checkpoint holds, {state-dict name of `skeleton`: its name in that model}): the
    model itself and its own names unless peft wrapped it; then the base model peft holds, its prefix dropped and
    every wrapped module's `.base_layer.` too (the names from_pretrained loaded before the wrap)."""
    names = list(skeleton.state_dict(keep_vars=True))
    get_base = getattr(skeleton, "get_base_model", None)
    base = get_base() if callable(get_base) else skeleton
    if base is skeleton:
        return skeleton, {name: name for name in names}
    prefix = next(path for path, module in skeleton.named_modules() if module is base)
    wrapped = {f"{path}.{BASE_LAYER}." if path else f"{BASE_LAYER}.": f"{path}." if path else ""
               for path, module in base.named_modules()
               if callable(getattr(module, "get_base_layer", None)) and isinstance(getattr(module, BASE_LAYER, None),
                                                                                  nn.Module)}
    mapped = {}
    for name in names:
        inner = name.removeprefix(f"{prefix}.") if prefix else name
        for old, new in wrapped.items():
            if inner.startswith(old):
                inner = new + inner.removeprefix(old)
                break
        mapped[name] = inner
    return base, mapped


class FreshCapture:
    """While open, every parameter registered on a module off the meta device (`with FreshCapture() as fresh:` around
    a meta build); `fresh.values(model)` then gives those the model now holds on the meta device, by state-dict name:
    the values the build drew and moved to the meta device (peft's adapter), detached, on the CPU."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, str], tuple[nn.Module, Tensor]] = {}
        self._handle: torch.utils.hooks.RemovableHandle | None = None

    def __enter__(self) -> FreshCapture:
        from torch.nn.modules.module import register_module_parameter_registration_hook

        def hook(module: nn.Module, name: str, param: Tensor | None) -> None:
            if param is not None and not param.is_meta:
                self._made[(id(module), name)] = (module, param)  # the module kept: its id is never reused here
            else:
                self._made.pop((id(module), name), None)

        self._handle = register_module_parameter_registration_hook(hook)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.remove()

    def values(self, model: nn.Module) -> dict[str, Tensor]:
        """{state-dict name: value} of every parameter of `model` on the meta device that was registered elsewhere
        with the same shape and dtype (the last registration under its module and name)."""
        fresh: dict[str, Tensor] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            for name, param in module.named_parameters(recurse=False):
                made = self._made.get((id(module), name))
                if made is None or made[0] is not module or not param.is_meta:
                    continue
                value = made[1].detach()
                if value.shape == param.shape and value.dtype == param.dtype and value.device.type == "cpu":
                    fresh[f"{path}.{name}" if path else name] = value
        return fresh

    def clear(self) -> None:
        self._made.clear()

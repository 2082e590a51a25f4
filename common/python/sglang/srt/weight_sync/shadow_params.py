"""A shadow of a model's parameters, written by the model's own loader.

The two-phase weight update stages what each rank keeps, not the whole
update: every bucket that arrives is handed to the model's own
`load_weights`, which writes it into a shadow copy of this rank's parameters
and persistent buffers (same shapes, dtypes, sharding and loader attributes),
never into the live ones. The apply then copies shadow into live, tensor by tensor,
between two batches; live storage keeps its addresses, so CUDA graphs stay
valid.

The loader runs on a clone of the model's module tree: every module is a
shallow copy of the live one whose parameters and persistent buffers are
the shadows (some loaders write buffers too, e.g. a layer's scalar read from
the checkpoint; caches such as rotary tables stay shared) and whose children
are the clones (a module or parameter shared in the live model is
shared in the clone, so tied weights stay tied). Everything the loader does
on a disk load happens the same way: fused q/k/v and gate/up, vocabulary
shards, name mapping, experts, only into other storage. The live model is
only read, so serving goes on meanwhile.

Tensors a module keeps outside its parameters and persistent buffers (a
plain attribute, a non-persistent buffer) are the clone's own copies: some
loaders derive weights into them in place (MLA models' `w_kc`/`w_vc`, from
`kv_b_proj`), which must not reach the serving model before the apply. Those
the loader wrote are copied into the live ones at the apply, the others are
left alone (serving may keep state in them). A loader that replaces a module
attribute or a parameter instead of writing into it (derived weights,
re-layouts) cannot be staged this way: that is detected after every bucket
and fails the update, naming the attribute.

Imports only torch and the standard library.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

PLACEMENTS = ("device", "host")


class ShadowLoadError(RuntimeError):
    """The loader did something a staged update cannot reproduce."""


def _persistent_buffers(module: torch.nn.Module) -> Iterable[torch.Tensor]:
    """The buffers a checkpoint holds (not caches such as rotary tables)."""
    for name, buffer in module._buffers.items():
        if buffer is not None and name not in module._non_persistent_buffers_set:
            yield buffer


def _distinct_tensors(models: Sequence[torch.nn.Module]) -> List[torch.Tensor]:
    """Every parameter and persistent buffer of `models`, shared ones once."""
    seen: Dict[int, torch.Tensor] = {}
    for model in models:
        for module in model.modules():
            for param in module._parameters.values():
                if param is not None:
                    seen.setdefault(id(param), param)
            for buffer in _persistent_buffers(module):
                seen.setdefault(id(buffer), buffer)
    return list(seen.values())


def parameter_bytes(models: Sequence[torch.nn.Module]) -> int:
    """Bytes a shadow of these models' parameters and persistent buffers
    takes (shared ones once)."""
    return sum(t.numel() * t.element_size() for t in _distinct_tensors(models))


def staged_copy_bytes(models: Sequence[torch.nn.Module]) -> int:
    """Bytes an update's staged copy of `models` takes: the shadow of their
    parameters and persistent buffers, and the clones' own copies of the
    tensors modules keep outside them (plain tensor attributes,
    non-persistent buffers; shared ones once)."""
    shadowed = {id(t) for t in _distinct_tensors(models)}
    derived: Dict[int, torch.Tensor] = {}
    for model in models:
        for module in model.modules():
            for value in module.__dict__.values():
                if isinstance(value, torch.Tensor):
                    derived.setdefault(id(value), value)
            for buffer in module._buffers.values():
                if buffer is not None and id(buffer) not in shadowed:
                    derived.setdefault(id(buffer), buffer)
    copies = sum(t.numel() * t.element_size() for t in derived.values())
    return parameter_bytes(models) + copies


def _shadow_of(live: torch.Tensor, placement: str) -> torch.Tensor:
    if placement == "host":
        data = torch.empty(
            live.shape,
            dtype=live.dtype,
            device="cpu",
            pin_memory=torch.cuda.is_available(),
        )
    else:
        data = torch.empty_like(live.data)
    # The same class (a loader may call the parameter's own methods) and the
    # same attributes (weight_loader, output_dim, ...).
    shadow = torch.Tensor._make_subclass(type(live), data, False)
    shadow.__dict__.update(live.__dict__)
    return shadow


# A module's tree slots, and what each holds.
_TREE_SLOTS = {
    "_parameters": "parameter",
    "_buffers": "buffer",
    "_modules": "submodule",
}


class ShadowParameters:
    """A shadow of every parameter and persistent buffer of `models` (a served
    model and, with speculative decoding, its draft models), their loaders
    running on clones."""

    def __init__(self, models: Sequence[torch.nn.Module], placement: str = "device"):
        assert placement in PLACEMENTS, placement
        self.placement = placement
        self._live = _distinct_tensors(models)
        self._shadows: Dict[int, torch.Tensor] = {
            id(p): _shadow_of(p, placement) for p in self._live
        }
        self._addresses = {id(p): s.data_ptr() for p, s in self._pairs()}
        self._models = list(models)
        self._clones: List[torch.nn.Module] = []
        # (live module, its clone, the clone's attributes as cloned)
        self._cloned: List[Tuple[torch.nn.Module, torch.nn.Module, Dict]] = []
        # By the live tensor's id: (live tensor, the clone's copy, the
        # copy's version when made)
        self._derived: Dict[int, Tuple[torch.Tensor, torch.Tensor, int]] = {}

    def _pairs(self) -> Iterable[Tuple[torch.Tensor, torch.Tensor]]:
        return ((live, self._shadows[id(live)]) for live in self._live)

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self._live)

    def matches(self, models: Sequence[torch.nn.Module]) -> bool:
        """Still a shadow of exactly these models' parameters and buffers."""
        if len(models) != len(self._models) or any(
            a is not b for a, b in zip(models, self._models)
        ):
            return False
        live = _distinct_tensors(models)
        return len(live) == len(self._live) and all(
            a is b
            and self._shadows[id(a)].shape == a.shape
            and self._shadows[id(a)].dtype == a.dtype
            for a, b in zip(live, self._live)
        )

    # The clone ----------------------------------------------------------------

    def _clone_tree(self, model: torch.nn.Module) -> torch.nn.Module:
        clones: Dict[int, torch.nn.Module] = {}

        def clone(module: torch.nn.Module) -> torch.nn.Module:
            copy = clones.get(id(module))
            if copy is not None:
                return copy
            copy = object.__new__(type(module))
            copy.__dict__.update(module.__dict__)
            clones[id(module)] = copy
            for key, value in module.__dict__.items():
                if isinstance(value, torch.Tensor):
                    copy.__dict__[key] = self._derived_copy(value)
            copy.__dict__["_parameters"] = {
                name: None if p is None else self._shadows[id(p)]
                for name, p in module._parameters.items()
            }
            copy.__dict__["_buffers"] = {
                name: None if b is None else self._buffer_of_clone(b)
                for name, b in module._buffers.items()
            }
            copy.__dict__["_modules"] = {
                name: None if child is None else clone(child)
                for name, child in module._modules.items()
            }
            cloned = {
                key: dict(value) if key in _TREE_SLOTS else value
                for key, value in copy.__dict__.items()
            }
            self._cloned.append((module, copy, cloned))
            return copy

        return clone(model)

    def _buffer_of_clone(self, live: torch.Tensor) -> torch.Tensor:
        shadow = self._shadows.get(id(live))
        return self._derived_copy(live) if shadow is None else shadow

    def _derived_copy(self, live: torch.Tensor) -> torch.Tensor:
        """The clone's own copy of a tensor outside the parameters and
        persistent buffers (one per live tensor), placed as the shadow."""
        known = self._derived.get(id(live))
        if known is not None:
            return known[1]
        with torch.no_grad():
            copy = _shadow_of(live, self.placement)
            copy.copy_(live)
        self._derived[id(live)] = (live, copy, copy._version)
        return copy

    def _check_clones_untouched(self) -> None:
        """Fail naming what the loader replaced instead of writing into: the
        apply copies tensor bytes only, so such a change would be lost."""
        for live, copy, cloned in self._cloned:
            where = type(live).__name__
            for key in cloned.keys() | copy.__dict__.keys():
                if key in _TREE_SLOTS:
                    kind = _TREE_SLOTS[key]
                    slot, was = copy.__dict__.get(key, {}), cloned.get(key, {})
                    for name, value in was.items():
                        if slot.get(name) is not value:
                            raise ShadowLoadError(
                                f"the model's loader replaced {kind} {name!r} of "
                                f"{where} instead of writing into it; a staged "
                                f"update cannot apply that"
                            )
                    for name in slot.keys() - was.keys():
                        raise ShadowLoadError(
                            f"the model's loader added {kind} {name!r} to {where}"
                        )
                elif copy.__dict__.get(key) is not cloned.get(key):
                    raise ShadowLoadError(
                        f"the model's loader set attribute {key!r} of {where} "
                        f"(weights derived while loading); a staged update "
                        f"cannot apply that"
                    )
        for live, shadow in self._pairs():
            if shadow.data_ptr() != self._addresses[id(live)]:
                raise ShadowLoadError(
                    "the model's loader replaced a tensor's storage instead "
                    "of writing into it; a staged update cannot apply that"
                )

    # Data -----------------------------------------------------------------------

    def begin(self) -> None:
        """Before an update's first bucket: shadow = live (what the update
        does not name keeps its bytes), and fresh clones of the module tree."""
        with torch.no_grad():
            for live, shadow in self._pairs():
                shadow.copy_(live.data, non_blocking=True)
        if self.placement == "host" and any(p.is_cuda for p in self._live):
            # The loader may touch the host copy on the CPU: the copies first.
            torch.cuda.current_stream().synchronize()
        self._cloned = []
        self._derived = {}
        self._clones = [self._clone_tree(model) for model in self._models]

    def load(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """One bucket's tensors through each model's own loader, into the
        shadow."""
        tensors = list(named_tensors)
        with torch.no_grad():
            for clone in self._clones:
                clone.load_weights(iter(tensors))
        self._check_clones_untouched()

    def _written_derived(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The (live, copy) pairs of derived tensors the loader wrote."""
        return [
            (live, copy)
            for live, copy, version in self._derived.values()
            if copy._version != version
        ]

    def check_appliable(self) -> Optional[str]:
        """Why the apply could not copy every shadow into its live parameter
        (checked before the first copy), or None."""
        for live, shadow in [*self._pairs(), *self._written_derived()]:
            if shadow.shape != live.shape or shadow.dtype != live.dtype:
                return (
                    f"a staged tensor is {shadow.dtype} {list(shadow.shape)}, "
                    f"its live one {live.dtype} {list(live.shape)}"
                )
        return None

    def apply(self) -> None:
        """Live = shadow, in place (the live storage keeps its address), and
        every derived tensor the loader wrote."""
        # A batch may still run on another stream, reading the live weights
        # (an overlapping scheduler launches the next batch before it takes
        # requests): wait for it, so that no forward reads half an update.
        for device in {p.device for p in self._live if p.is_cuda}:
            torch.cuda.synchronize(device)
        with torch.no_grad():
            for live, shadow in self._pairs():
                live.data.copy_(shadow, non_blocking=True)
            for live, copy in self._written_derived():
                live.data.copy_(copy, non_blocking=True)
        if any(p.is_cuda for p in self._live):
            torch.cuda.current_stream().synchronize()
        # The clones and their copies are made afresh for the next update.
        self._clones, self._cloned = [], []
        self._derived = {}


def unsupported_post_processing(models: Sequence[torch.nn.Module]) -> Optional[str]:
    """Why a staged update cannot be applied by copying: a layer that serves
    its weights in another layout than the checkpoint's (re-laid out after
    loading: a quantization method's `process_weights_after_loading`, a
    backend's kernels). The loader writes the checkpoint's layout into the
    shadow and the apply copies it as it is, so such a layer would serve it.
    None when every layer serves its weights as they were loaded."""
    for model in models:
        for name, module in model.named_modules():
            relayout = _serving_relayout(module)
            if relayout:
                return (
                    f"layer {name!r} {relayout}; a staged update would apply "
                    f"the checkpoint's layout, so it is refused (use "
                    f"/update_weights_from_disk for this model)"
                )
    return None


def _serving_relayout(module: torch.nn.Module) -> Optional[str]:
    """How this layer's weights are re-laid out for serving, or None. Only
    unquantized layers qualify, and of those only the ones whose kernels
    need no re-layout: fused experts lose that with flashinfer's TRT-LLM
    block layout, the interleaved SwiGLU epilogue, aiter's shuffle and the
    NPU's transpose."""
    if getattr(module, "use_intel_amx_backend", False):
        return "keeps its weights re-laid out for the CPU's AMX kernels"
    method = getattr(module, "quant_method", None)
    if method is None:
        return None
    kind = type(method).__name__
    if not kind.startswith("Unquantized"):
        return f"uses {kind}, whose weights are post-processed after loading"
    if getattr(method, "use_flashinfer_trtllm_moe", False):
        return f"uses {kind} with flashinfer's TRT-LLM kernels (a block layout)"
    if getattr(method, "w13_swiglu_interleaved", False):
        return f"uses {kind} with the gate and up rows interleaved"
    experts = getattr(module, "w13_weight", None)
    if isinstance(experts, torch.Tensor):
        if torch.version.hip is not None and _aiter_enabled():
            return f"uses {kind} on aiter, which shuffles the experts"
        if experts.device.type == "npu":
            return f"uses {kind} on an NPU, which transposes the experts"
    return None


def _aiter_enabled() -> bool:
    return os.environ.get("SGLANG_USE_AITER", "").strip().lower() in ("1", "true")

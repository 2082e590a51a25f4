"""Check that a weight update can be applied, before any byte moves.

The apply runs the model's own loader (`model.load_weights`), which writes
parameter after parameter: a tensor it rejects halfway (a wrong shape, a dtype
it cannot take) would leave the model partly updated. So `prepare` runs the
same loader first on meta tensors of the declared names, dtypes and shapes,
with every parameter swapped for a meta stand-in carrying the same attributes
(its `weight_loader`, shard dimensions, ...): whatever the loader would reject
during the apply, it rejects here, and nothing real is read or written.
Whatever the loader assigns to the module tree meanwhile is undone.

A loader may also accept a wrong shape silently (a sharded loader narrows
an oversized tensor to its shard), so tensors named as in the served
checkpoint must also have the checkpoint's shapes, read from the headers of
its safetensors files.

Imports only torch (and reads safetensors headers with the standard library).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import struct
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

logger = logging.getLogger(__name__)

# Errors that say the loader needed real data, not that the update is wrong
# (torch words them many ways: "Meta tensors", "meta device", "data-dependent").
_META_LIMITS = re.compile(r"\bmeta\b|data-(in)?dependent", re.IGNORECASE)
# Raw bytes of these dtypes cannot be reinterpreted as a tensor, or cannot be
# loaded into a model whose parameters are all floating point.
_NEVER_LOADABLE = (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2)


class LoadCheckError(ValueError):
    """The update cannot be applied: `index` is the offending tensor's
    position in the checked sequence, `field` what is wrong with it."""

    def __init__(self, message: str, index: int, field: str):
        super().__init__(message)
        self.index = index
        self.field = field


# Where a module keeps its parameters, buffers and submodules (in its __dict__).
_MODULE_STORES = ("_parameters", "_buffers", "_modules")


@contextmanager
def _loader_sandbox(model: torch.nn.Module) -> Iterator[None]:
    """Swap every parameter for a meta stand-in (shared parameters stay
    shared), and afterwards, whatever happened, put back every module's
    attributes, parameters, buffers and submodules as they were, the very
    same objects.

    The loader runs on the live module tree, and some loaders assign what
    they compute from a loaded tensor (a scale, a transposed copy) to a module
    attribute: left in place, that meta tensor would serve. State changed in
    place inside an object (a list appended to) is not undone; a tensor's
    in-place write fails on meta tensors.
    """
    saved: List[Tuple[torch.nn.Module, Dict[str, object], Dict[str, dict]]] = []
    for module in model.modules():
        attributes = dict(module.__dict__)
        stores = {store: dict(attributes[store]) for store in _MODULE_STORES}
        saved.append((module, attributes, stores))
    stand_ins: Dict[int, torch.nn.Parameter] = {}
    try:
        for module, _, stores in saved:
            for name, param in stores["_parameters"].items():
                if param is None:
                    continue
                stand_in = stand_ins.get(id(param))
                if stand_in is None:
                    # The same class: a loader may call the parameter's own
                    # methods (weight_loader on SGLang's parameter classes).
                    stand_in = torch.Tensor._make_subclass(
                        type(param),
                        torch.empty_like(param, device="meta"),
                        param.requires_grad,
                    )
                    stand_in.__dict__.update(param.__dict__)
                    stand_ins[id(param)] = stand_in
                module._parameters[name] = stand_in
        yield
    finally:
        for module, attributes, stores in saved:
            for added in module.__dict__.keys() - attributes.keys():
                del module.__dict__[added]
            module.__dict__.update(attributes)
            for store, entries in stores.items():
                attributes[store].clear()
                attributes[store].update(entries)


def _floating_only(model: torch.nn.Module) -> bool:
    return all(p.dtype.is_floating_point for p in model.parameters())


def check_loadable(
    model: torch.nn.Module,
    tensors: Sequence[Tuple[str, torch.dtype, Tuple[int, ...]]],
) -> Optional[str]:
    """Run the model's loader over meta tensors of `(name, dtype, shape)`.

    Raises LoadCheckError naming the first tensor the loader rejects. Returns
    None when the loader accepted everything, or a note when the loader needs
    real data and so could not be checked (the update is then not refused).
    """
    floating_only = _floating_only(model)
    for index, (name, dtype, _) in enumerate(tensors):
        if dtype in _NEVER_LOADABLE or dtype.is_complex:
            raise LoadCheckError(
                f"dtype {dtype} cannot be loaded into {name!r}", index, "dtypes"
            )
        if floating_only and not dtype.is_floating_point:
            raise LoadCheckError(
                f"dtype {dtype} cannot be loaded into {name!r}: the model's "
                f"parameters are all floating point",
                index,
                "dtypes",
            )

    position = [-1]

    def meta_weights() -> Iterator[Tuple[str, torch.Tensor]]:
        for index, (name, dtype, shape) in enumerate(tensors):
            position[0] = index
            yield name, torch.empty(shape, dtype=dtype, device="meta")

    try:
        with _loader_sandbox(model), torch.no_grad():
            model.load_weights(meta_weights())
    except Exception as e:
        index = max(position[0], 0)
        message = f"{type(e).__name__}: {e}"
        if _META_LIMITS.search(message):
            note = (
                f"the model's loader could not be checked without data "
                f"({message.splitlines()[0]})"
            )
            logger.warning(f"weight update load check skipped: {note}")
            return note
        name, dtype, shape = tensors[index]
        raise LoadCheckError(
            f"the model cannot load {name!r} as {dtype} {list(shape)}: "
            f"{message.splitlines()[0]}",
            index,
            "shapes",
        ) from e
    return None


@functools.lru_cache(maxsize=4)
def checkpoint_shapes(model_path: str) -> Dict[str, Tuple[int, ...]]:
    """Tensor shapes by name from the headers of the safetensors files in a
    local checkpoint directory ({} when there is none to read)."""
    shapes: Dict[str, Tuple[int, ...]] = {}
    if not os.path.isdir(model_path):
        return shapes
    for file in sorted(os.listdir(model_path)):
        if not file.endswith(".safetensors"):
            continue
        try:
            with open(os.path.join(model_path, file), "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error) as e:
            logger.warning(f"checkpoint shapes: cannot read {file}: {e}")
            return {}
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                shapes[name] = tuple(entry.get("shape", ()))
    return shapes


def check_declared_shapes(
    model: torch.nn.Module,
    model_path: str,
    tp_size: int,
    tensors: Sequence[Tuple[str, torch.dtype, Tuple[int, ...]]],
) -> None:
    """Raise LoadCheckError for a tensor whose declared shape cannot be what
    it names: a checkpoint name must have the served checkpoint's shape; a
    linear layer's own (fused) parameter name, e.g. qkv_proj, must have the
    parameter's full shape (this rank's shard, one dimension times the TP
    size), since the fused loaders pad or narrow whatever they get."""
    expected = checkpoint_shapes(model_path)
    linear = _linear_parameter_shapes(model)
    for index, (name, _, shape) in enumerate(tensors):
        shape = tuple(shape)
        want = expected.get(name)
        if want is not None:
            if shape != want:
                raise LoadCheckError(
                    f"{name!r} has shape {list(want)} in the served checkpoint, "
                    f"not {list(shape)}",
                    index,
                    "shapes",
                )
        elif name in linear and not _is_full_shape(shape, linear[name], tp_size):
            raise LoadCheckError(
                f"{name!r} is {list(linear[name])} on each of {tp_size} TP rank(s); "
                f"{list(shape)} cannot be its full shape",
                index,
                "shapes",
            )


def _linear_parameter_shapes(model: torch.nn.Module) -> Dict[str, Tuple[int, ...]]:
    """Shapes of the parameters owned by linear layers (any class whose
    ancestry has a LinearBase), by their names in the model."""
    shapes: Dict[str, Tuple[int, ...]] = {}
    for module_name, module in model.named_modules():
        if not any(c.__name__ == "LinearBase" for c in type(module).__mro__):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            shapes[full] = tuple(param.shape)
    return shapes


def _is_full_shape(
    shape: Tuple[int, ...], shard: Tuple[int, ...], tp_size: int
) -> bool:
    if len(shape) != len(shard):
        return False
    differ = [d for d in range(len(shard)) if shape[d] != shard[d]]
    return not differ or (
        len(differ) == 1 and shape[differ[0]] == shard[differ[0]] * tp_size
    )

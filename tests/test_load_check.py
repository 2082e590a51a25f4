"""The load check run at prepare (weight_sync/load_check.py): the model's own
loader over meta stand-ins rejects what the apply would reject, names the
tensor, touches no real parameter, and says so when it cannot check."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from sglang.srt.weight_sync.load_check import (
    LoadCheckError,
    check_declared_shapes,
    check_loadable,
    checkpoint_shapes,
)


class Tiny(torch.nn.Module):
    """A loader in the style of SGLang's: a stacked parameter filled shard by
    shard, a tied one, and a default loader that checks sizes."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(6, 4), requires_grad=False)
        self.norm = torch.nn.Parameter(torch.ones(4), requires_grad=False)
        self.head = torch.nn.Linear(4, 3, bias=False)
        self.embed = self.head.weight  # tied

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, w in weights:
            for shard, part in enumerate(("q", "k", "v")):
                if name == f"{part}.weight":
                    target = params["qkv"].data.narrow(0, 2 * shard, 2)
                    assert target.shape == w.shape, (target.shape, w.shape)
                    target.copy_(w)
                    break
            else:
                param = params[name]
                assert param.shape == w.shape, (param.shape, w.shape)
                param.data.copy_(w)


def specs(*items):
    return [(n, dtype, tuple(shape)) for n, dtype, shape in items]


def test_a_good_update_passes_and_nothing_real_is_touched():
    model = Tiny()
    before = {n: (p, p.data_ptr(), p.clone()) for n, p in model.named_parameters()}
    assert (
        check_loadable(
            model,
            specs(
                ("q.weight", torch.bfloat16, [2, 4]),
                ("v.weight", torch.float32, [2, 4]),
                ("embed", torch.bfloat16, [3, 4]),
            ),
        )
        is None
    )
    after = dict(model.named_parameters())
    for name, (param, ptr, values) in before.items():
        assert after[name] is param and param.data_ptr() == ptr
        assert param.device.type == "cpu" and torch.equal(param, values)
    assert model.embed is model.head.weight


def test_the_rejected_tensor_is_named_by_position():
    model = Tiny()
    with pytest.raises(LoadCheckError) as err:
        check_loadable(
            model,
            specs(
                ("q.weight", torch.bfloat16, [2, 4]),
                ("norm", torch.bfloat16, [4]),
                ("k.weight", torch.bfloat16, [2, 5]),
            ),
        )
    assert err.value.index == 2 and err.value.field == "shapes"
    assert "'k.weight'" in str(err.value)
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize(
    "dtype", [torch.qint8, torch.int8, torch.bool, torch.complex64]
)
def test_dtypes_a_floating_point_model_cannot_take(dtype):
    with pytest.raises(LoadCheckError) as err:
        check_loadable(Tiny(), specs(("norm", dtype, [4])))
    assert err.value.field == "dtypes"


def test_a_loader_that_needs_data_is_reported_not_refused():
    class NeedsData(Tiny):
        def load_weights(self, weights):
            for _, w in weights:
                w.sum().item()

    note = check_loadable(NeedsData(), specs(("norm", torch.float32, [4])))
    assert note is not None and "could not be checked" in note


class AssignsFromLoaded(torch.nn.Module):
    """A loader in the style of MLA models': it computes from a loaded
    tensor and assigns the result to the model (an attribute, a buffer, a
    parameter, a submodule), then may fail where real data is needed."""

    def __init__(self, then_needs_data: bool):
        super().__init__()
        self.attn = torch.nn.Linear(4, 4, bias=False)
        self.attn.w_scale = torch.ones(1)
        self.attn.register_buffer("w_kc", torch.zeros(4, 4))
        self.then_needs_data = then_needs_data

    def load_weights(self, weights):
        for _, w in weights:
            self.attn.w_scale = w.float().abs().amax().reshape(1)
            self.attn.w_kc = w.t().contiguous()
            self.attn.w_vc = w.clone()
            self.attn.weight = torch.nn.Parameter(w, requires_grad=False)
            self.attn.proj = torch.nn.Linear(4, 4, device="meta")
            if self.then_needs_data:
                w.sum().item()


def identities(model: torch.nn.Module) -> dict:
    """Every module's attributes and the entries of its parameter, buffer and
    submodule stores, as object identities."""
    state = {}
    for module_name, module in model.named_modules():
        for key, value in vars(module).items():
            state[(module_name, key)] = id(value)
            if key in ("_parameters", "_buffers", "_modules"):
                for entry, item in value.items():
                    state[(module_name, key, entry)] = id(item)
    return state


@pytest.mark.parametrize("then_needs_data", [False, True])
def test_what_the_loader_assigns_to_the_model_is_undone(then_needs_data):
    model = AssignsFromLoaded(then_needs_data)
    before = identities(model)
    check_loadable(model, specs(("attn.weight", torch.float32, [4, 4])))
    assert identities(model) == before
    assert not hasattr(model.attn, "w_vc") and not hasattr(model.attn, "proj")
    live = [*model.parameters(), *model.buffers(), model.attn.w_scale]
    assert all(t.device.type == "cpu" for t in live)
    assert torch.equal(model.attn.w_scale, torch.ones(1))


@pytest.mark.parametrize(
    "needs_data",
    [
        lambda w: w.numpy(),
        lambda w: torch.unique(w),
        lambda w: w[w > 0],
        lambda w: w.sum().item(),
    ],
    ids=["numpy", "unique", "mask", "item"],
)
def test_every_way_torch_says_it_needs_data_is_reported_not_refused(needs_data):
    class NeedsData(Tiny):
        def load_weights(self, weights):
            for _, w in weights:
                needs_data(w)

    note = check_loadable(NeedsData(), specs(("norm", torch.float32, [4])))
    assert note is not None and "could not be checked" in note


class OwnLoaderParameter(torch.nn.Parameter):
    """A parameter class whose own method loads it, as SGLang's do."""

    def load(self, w: torch.Tensor) -> None:
        if self.shape != w.shape:
            raise ValueError(f"shape {list(w.shape)} is not {list(self.shape)}")
        self.data.copy_(w)


class LoadsThroughTheParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = OwnLoaderParameter(torch.zeros(2, 3), requires_grad=False)

    def load_weights(self, weights):
        for name, w in weights:
            getattr(self, name).load(w)


def test_a_parameter_class_s_own_loader_runs_on_its_stand_in():
    model = LoadsThroughTheParameter()
    assert check_loadable(model, specs(("w", torch.float32, [2, 3]))) is None
    with pytest.raises(LoadCheckError) as err:
        check_loadable(model, specs(("w", torch.float32, [3, 2])))
    assert "shape [3, 2] is not [2, 3]" in str(err.value)
    assert type(model.w) is OwnLoaderParameter and model.w.device.type == "cpu"


def write_safetensors_header(path: Path, shapes: dict) -> None:
    header = {
        n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]}
        for n, s in shapes.items()
    }
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_checkpoint_shapes_catch_what_a_lenient_loader_accepts(tmp_path):
    write_safetensors_header(tmp_path / "model.safetensors", {"a.weight": [8, 4]})
    checkpoint_shapes.cache_clear()
    assert checkpoint_shapes(str(tmp_path)) == {"a.weight": (8, 4)}
    model = Tiny()
    check_declared_shapes(
        model, str(tmp_path), 1, specs(("a.weight", torch.bfloat16, [8, 4]))
    )
    check_declared_shapes(
        model, str(tmp_path), 1, specs(("fused", torch.bfloat16, [1]))
    )
    with pytest.raises(
        LoadCheckError, match=r"\[8, 4\] in the served checkpoint, not \[9, 4\]"
    ):
        check_declared_shapes(
            model, str(tmp_path), 1, specs(("a.weight", torch.bfloat16, [9, 4]))
        )
    assert checkpoint_shapes(str(tmp_path / "missing")) == {}


class LinearBase(torch.nn.Module):
    """Named as SGLang's base of linear layers, whose fused loaders pad or
    narrow whatever they get."""

    def __init__(self, rows: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(rows, 4), requires_grad=False)


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = LinearBase(6)


@pytest.mark.parametrize(
    "tp,shape,ok",
    [
        (1, [6, 4], True),
        (1, [3, 4], False),
        (2, [12, 4], True),
        (2, [6, 8], True),
        (2, [6, 4], True),
        (2, [7, 4], False),
        (2, [12, 8], False),
        (1, [24], False),
    ],
)
def test_a_fused_linear_parameter_takes_its_full_shape_only(tmp_path, tp, shape, ok):
    tensors = specs(("qkv_proj.weight", torch.bfloat16, shape))
    if ok:
        check_declared_shapes(Fused(), str(tmp_path), tp, tensors)
    else:
        with pytest.raises(LoadCheckError, match="cannot be its full shape"):
            check_declared_shapes(Fused(), str(tmp_path), tp, tensors)

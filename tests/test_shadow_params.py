"""The staged copy of a rank's parameters (weight_sync/shadow_params.py),
with torch modules whose loaders behave as SGLang's do: written in place
through each parameter's own `weight_loader`, tied weights shared.

The module is loaded by file path from common/ (it imports only torch); the
real models' loaders are exercised on real servers by test_shard_staging.py
and test_model_families.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "common/python/sglang/srt/weight_sync/shadow_params.py"


def _load():
    spec = importlib.util.spec_from_file_location("shadow_params_source", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shadow_params = _load()


class Linear(torch.nn.Module):
    def __init__(self, rows: int, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(rows, cols), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard=None):
        # Like a fused layer's loader: a shard writes its rows only.
        target = param.data if shard is None else param.data[shard * 2 : shard * 2 + 2]
        target.copy_(loaded)


class TinyLM(torch.nn.Module):
    """Embedding tied to the head, and a fused projection of two shards."""

    def __init__(self):
        super().__init__()
        self.embed = Linear(8, 4)
        self.fused = Linear(4, 4)
        self.head = self.embed  # tied: the same module

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name.startswith("part"):
                param = params["fused.weight"]
                param.weight_loader(param, tensor, int(name[-1]))
            else:
                param = params[name]
                param.weight_loader(param, tensor)


def live_bytes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_loader_writes_the_copy_and_apply_copies_it_in_place():
    torch.manual_seed(0)
    model = TinyLM()
    before = live_bytes(model)
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    shadow = shadow_params.ShadowParameters([model])
    assert shadow.nbytes == (8 * 4 + 4 * 4) * 4, "the tied weight counts once"

    shadow.begin()
    new_embed, new_part = torch.ones(8, 4), torch.full((2, 4), 7.0)
    shadow.load(iter([("embed.weight", new_embed)]))
    shadow.load(iter([("part1", new_part)]))
    for name, tensor in model.named_parameters():
        assert torch.equal(tensor, before[name]), f"{name} changed before the apply"

    assert shadow.check_appliable() is None
    shadow.apply()
    assert torch.equal(model.embed.weight, new_embed)
    assert model.head.weight is model.embed.weight, "still tied"
    assert torch.equal(model.fused.weight[2:4], new_part)
    assert torch.equal(
        model.fused.weight[0:2], before["fused.weight"][0:2]
    ), "the shard the update did not name keeps its bytes"
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == addresses


class ScaledLM(TinyLM):
    """A layer scalar kept as a persistent buffer and read from the
    checkpoint like a parameter (as some models' loaders do)."""

    def __init__(self):
        super().__init__()
        self.fused.register_buffer("layer_scalar", torch.ones(1))
        self.fused.register_buffer("cache", torch.zeros(64), persistent=False)

    def load_weights(self, weights):
        tensors = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        for name, tensor in weights:
            tensors[name].data.copy_(tensor)


def test_a_buffer_the_loader_writes_changes_only_at_the_apply():
    model = ScaledLM()
    live = model.fused.layer_scalar
    shadow = shadow_params.ShadowParameters([model])
    shadow.begin()
    shadow.load([("fused.layer_scalar", torch.full((1,), 3.0))])
    assert live.item() == 1.0, "the update reached the served model before the apply"
    shadow.apply()
    assert model.fused.layer_scalar is live and live.item() == 3.0
    # A cache no checkpoint holds is not staged (nor counted).
    assert shadow.nbytes == shadow_params.parameter_bytes([TinyLM()]) + 4
    shadow.begin()  # an update that is then discarded
    shadow.load([("fused.layer_scalar", torch.full((1,), 5.0))])
    assert live.item() == 3.0


def test_each_update_starts_from_the_live_weights():
    """A partial update after another path changed the live weights keeps
    those changes for everything it does not name."""
    model = TinyLM()
    shadow = shadow_params.ShadowParameters([model])
    with torch.no_grad():
        model.fused.weight.fill_(3.0)  # e.g. a disk load in between
    shadow.begin()
    shadow.load(iter([("part0", torch.zeros(2, 4))]))
    shadow.apply()
    assert torch.equal(model.fused.weight[2:4], torch.full((2, 4), 3.0))
    assert torch.equal(model.fused.weight[0:2], torch.zeros(2, 4))


class Replacing(TinyLM):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def load_weights(self, weights):
        for _, tensor in weights:
            if self.how == "parameter":
                self.fused.weight = torch.nn.Parameter(tensor.clone())
            elif self.how == "attribute":
                self.fused.derived = tensor.t().contiguous()
            else:
                self.fused.weight.data = tensor.clone()


@pytest.mark.parametrize(
    "how,named",
    [
        ("parameter", "replaced parameter .weight. of Linear"),
        ("attribute", "set attribute 'derived' of Linear"),
        ("storage", "replaced a tensor's storage"),
    ],
)
def test_a_loader_that_replaces_instead_of_writing_is_refused(how, named):
    model = Replacing(how)
    before = live_bytes(model)
    shadow = shadow_params.ShadowParameters([model])
    shadow.begin()
    with pytest.raises(shadow_params.ShadowLoadError, match=named):
        shadow.load(iter([("fused.weight", torch.zeros(4, 4))]))
    for name, tensor in model.named_parameters():
        assert torch.equal(tensor, before[name])
    assert "derived" not in model.fused.__dict__


def test_layers_post_processed_after_loading_are_named():
    class Fp8LinearMethod:
        pass

    class UnquantizedLinearMethod:
        pass

    model = TinyLM()
    model.fused.quant_method = UnquantizedLinearMethod()
    assert shadow_params.unsupported_post_processing([model]) is None
    model.fused.quant_method = Fp8LinearMethod()
    message = shadow_params.unsupported_post_processing([model])
    assert "'fused'" in message and "Fp8LinearMethod" in message


def test_weights_the_loader_derives_into_attributes_change_only_at_the_apply():
    """As MLA models' loaders do with w_kc/w_vc: tensors kept outside the
    parameters, written in place from a loaded weight. The serving model's
    must not change while the update arrives, nor at all if it fails; they
    change at the apply. A tensor the loader leaves alone is not reverted at
    the apply (serving may have written it meanwhile)."""

    class Derives(TinyLM):
        def __init__(self):
            super().__init__()
            self.w_kc = torch.zeros(4, 4)  # a plain attribute
            self.register_buffer("scratch", torch.zeros(2), persistent=False)
            self.state = torch.zeros(3)  # the loader never touches it

        def load_weights(self, weights):
            super().load_weights(weights)
            with torch.no_grad():
                self.w_kc.copy_(self.fused.weight * 2)  # bind_or_assign's way
                self.scratch.add_(1)

    model = Derives()
    live_w_kc, live_scratch, live_state = model.w_kc, model.scratch, model.state
    shadow = shadow_params.ShadowParameters([model])
    shadow.begin()
    new = torch.full((4, 4), 3.0)
    shadow.load([("fused.weight", new)])
    assert torch.equal(model.w_kc, torch.zeros(4, 4)), "written before the apply"
    assert torch.equal(model.scratch, torch.zeros(2)), "written before the apply"
    model.state.fill_(7.0)  # serving writes its own state meanwhile
    assert shadow.check_appliable() is None
    shadow.apply()
    assert model.w_kc is live_w_kc and model.scratch is live_scratch
    assert torch.equal(model.w_kc, new * 2) and torch.equal(
        model.scratch, torch.ones(2)
    )
    assert model.state is live_state and torch.equal(model.state, torch.full((3,), 7.0))

    # A discarded update (begun, loaded, never applied) leaves them as they were.
    shadow.begin()
    shadow.load([("fused.weight", torch.full((4, 4), 5.0))])
    assert torch.equal(model.w_kc, new * 2)


def test_the_staged_copy_s_bytes_count_the_derived_copies_once():
    """What prepare budgets and reports is what an update holds: the shadow
    and the clones' copies of tensors kept outside the parameters (shared
    ones once), each placed as the shadow is."""

    class Derives(TinyLM):
        def __init__(self):
            super().__init__()
            self.w_kc = torch.zeros(4, 4)
            self.alias = self.w_kc  # the same tensor twice
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    model = Derives()
    derived = (16 + 2) * 4
    params = shadow_params.parameter_bytes([model])
    assert shadow_params.staged_copy_bytes([model]) == params + derived
    shadow = shadow_params.ShadowParameters([model], placement="host")
    shadow.begin()
    (clone,) = shadow._clones
    assert clone.w_kc is clone.alias and clone.w_kc is not model.w_kc
    assert clone.w_kc.device.type == "cpu" and clone.scratch.device.type == "cpu"
    # The budget's rule and the clone's are written apart: what the clone
    # holds must be what the budget counted.
    copies = [copy for _, copy, _ in shadow._derived.values()]
    held = {id(t): t for t in [*shadow._shadows.values(), *copies]}
    held_bytes = sum(t.numel() * t.element_size() for t in held.values())
    assert held_bytes == shadow_params.staged_copy_bytes([model])


def test_experts_re_laid_out_for_their_kernels_are_refused(monkeypatch):
    """Unquantized fused experts serve in the checkpoint's layout only on
    some kernels: flashinfer's TRT-LLM block layout, the interleaved SwiGLU
    epilogue and aiter's shuffle re-lay them out after loading, so a staged
    update, which copies the checkpoint's layout, would serve garbage."""

    class UnquantizedFusedMoEMethod:
        use_flashinfer_trtllm_moe = False

    model = TinyLM()
    model.fused.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 3))
    model.fused.quant_method = UnquantizedFusedMoEMethod()
    monkeypatch.delenv("SGLANG_USE_AITER", raising=False)
    assert shadow_params.unsupported_post_processing([model]) is None

    model.fused.quant_method.use_flashinfer_trtllm_moe = True
    message = shadow_params.unsupported_post_processing([model])
    assert "'fused'" in message and "TRT-LLM" in message, message
    model.fused.quant_method = UnquantizedFusedMoEMethod()
    model.fused.quant_method.w13_swiglu_interleaved = True
    message = shadow_params.unsupported_post_processing([model])
    assert "'fused'" in message and "interleaved" in message, message

    model.fused.quant_method = UnquantizedFusedMoEMethod()
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    monkeypatch.setattr(torch.version, "hip", "6.4")
    message = shadow_params.unsupported_post_processing([model])
    assert "'fused'" in message and "aiter" in message, message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_forward_running_on_another_stream_reads_half_an_update():
    """SGLang's overlapping scheduler takes a complete while batch N still
    runs on its forward stream: the apply must not write the weights that
    forward reads (bench/gpu_apply_vs_running_batch.py measures the same;
    the copies without the wait raced it in 5 of 5 forwards on an H200)."""
    from bench import gpu_apply_vs_running_batch as bench

    model = bench.Model(layers=16, dim=4096)
    shadow = shadow_params.ShadowParameters([model])
    x = torch.ones(4096, 4096, device="cuda", dtype=torch.float16) / 4096
    stream = torch.cuda.Stream()
    for _ in range(3):
        trial = bench.one_trial(shadow, model, x, 40, stream, wait=True)
        assert trial["live_is_new"]
        assert trial["steps_reading_old"] == 40, trial

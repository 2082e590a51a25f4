"""Unit tests for the shadow parameters a staged weight update loads into — no
server, no model download; a small model loads the way SGLang's models do."""

import os
import unittest
from unittest import mock

import torch
from torch import nn

from sglang.srt.weight_sync.shadow_params import (
    ShadowLoadError,
    ShadowParameters,
    parameter_bytes,
    unsupported_post_processing,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=3, suite="base-a-test-cpu")

HIDDEN, Q, KV, VOCAB = 4, 4, 2, 6


class ShardedParameter(nn.Parameter):
    """Like SGLang's parameter classes: attributes set when it is made."""

    def __new__(cls, data, output_dim):
        param = super().__new__(cls, data, requires_grad=False)
        param._output_dim = output_dim
        return param

    @property
    def output_dim(self):
        return self._output_dim


def default_weight_loader(param, loaded_weight):
    param.data.copy_(loaded_weight)


class QKVLinear(nn.Module):
    """A fused q/k/v projection, filled shard by shard by its weight_loader."""

    def __init__(self):
        super().__init__()
        self.shards = {"q": (0, Q), "k": (Q, KV), "v": (Q + KV, KV)}
        self.weight = ShardedParameter(torch.randn(Q + 2 * KV, HIDDEN), 0)
        self.weight.weight_loader = self.weight_loader
        self.seen = []  # the parameters the loader was handed

    def weight_loader(self, param, loaded_weight, shard_id):
        self.seen.append(param)
        start, size = self.shards[shard_id]
        param.data.narrow(param.output_dim, start, size).copy_(loaded_weight)


class Head(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.weight = embed.weight  # tied


class TinyModel(nn.Module):
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
    ]

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN, dtype=torch.bfloat16)
        self.embed.weight.requires_grad_(False)
        self.qkv_proj = QKVLinear()
        self.lm_head = Head(self.embed)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            for fused, part, shard_id in self.stacked_params_mapping:
                if part in name:
                    param = params[name.replace(part, fused)]
                    param.weight_loader(param, tensor, shard_id)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)


class MisbehavingModel(TinyModel):
    """A loader that replaces what it should write into."""

    def load_weights(self, weights):
        for what, _ in weights:
            qkv = self.qkv_proj
            if what == "replace_parameter":
                qkv.weight = nn.Parameter(torch.zeros(Q + 2 * KV, HIDDEN))
            elif what == "derive_attribute":
                qkv.derived = qkv.weight.t()
            elif what == "replace_storage":
                qkv.weight.data = torch.zeros(Q + 2 * KV, HIDDEN)


class ScaledModel(TinyModel):
    """A layer scalar kept as a persistent buffer and loaded from the
    checkpoint like a parameter, as some models' loaders do."""

    def __init__(self):
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))

    def load_weights(self, weights):
        tensors = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        for name, tensor in weights:
            default_weight_loader(tensors[name], tensor)


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class TestShadowParameters(CustomTestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = TinyModel()
        self.before = snapshot(self.model)
        self.shadow = ShadowParameters([self.model])
        self.shadow.begin()

    def assert_live_unchanged(self):
        for name, param in self.model.named_parameters():
            self.assertTrue(torch.equal(param, self.before[name]), name)

    def test_the_loader_gets_a_shadow_like_the_live_parameter(self):
        self.shadow.load([("k_proj.weight", torch.ones(KV, HIDDEN))])
        live = self.model.qkv_proj.weight
        (staged,) = self.model.qkv_proj.seen
        self.assertIsNot(staged, live)
        self.assertNotEqual(staged.data_ptr(), live.data_ptr())
        self.assertIs(type(staged), ShardedParameter)
        self.assertEqual((staged.shape, staged.dtype), (live.shape, live.dtype))
        self.assertEqual(staged.output_dim, 0)
        self.assertEqual(staged.weight_loader, live.weight_loader)

    def test_the_loader_writes_the_shadow_not_the_live_parameters(self):
        self.shadow.load([("q_proj.weight", torch.ones(Q, HIDDEN))])
        self.shadow.load([("embed.weight", torch.ones(VOCAB, HIDDEN))])
        self.assert_live_unchanged()
        self.assertIsNone(self.shadow.check_appliable())

    def test_apply_copies_shards_in_place_and_keeps_the_rest(self):
        addresses = {n: p.data_ptr() for n, p in self.model.named_parameters()}
        self.shadow.load([("k_proj.weight", torch.full((KV, HIDDEN), 7.0))])
        self.shadow.apply()
        weight = self.model.qkv_proj.weight
        self.assertTrue(torch.equal(weight[Q : Q + KV], torch.full((KV, HIDDEN), 7.0)))
        before = self.before["qkv_proj.weight"]
        self.assertTrue(torch.equal(weight[:Q], before[:Q]))
        self.assertTrue(torch.equal(weight[Q + KV :], before[Q + KV :]))
        self.assertEqual(
            {n: p.data_ptr() for n, p in self.model.named_parameters()}, addresses
        )

    def test_tied_parameters_get_one_shadow_and_stay_tied(self):
        new = torch.full((VOCAB, HIDDEN), 3.0, dtype=torch.bfloat16)
        self.shadow.load([("embed.weight", new)])
        self.shadow.apply()
        self.assertIs(self.model.lm_head.weight, self.model.embed.weight)
        self.assertTrue(torch.equal(self.model.lm_head.weight, new))
        embed_bytes = VOCAB * HIDDEN * 2
        qkv_bytes = (Q + 2 * KV) * HIDDEN * 4
        self.assertEqual(self.shadow.nbytes, embed_bytes + qkv_bytes)
        self.assertEqual(parameter_bytes([self.model]), embed_bytes + qkv_bytes)

    def test_a_buffer_the_loader_writes_changes_only_at_the_apply(self):
        model = ScaledModel()
        live = model.layer_scalar
        shadow = ShadowParameters([model])
        shadow.begin()
        shadow.load([("layer_scalar", torch.full((1,), 3.0))])
        self.assertEqual(live.item(), 1.0)
        shadow.apply()
        self.assertIs(model.layer_scalar, live)
        self.assertEqual(live.item(), 3.0)

    def test_a_draft_model_sharing_the_embedding_stages_it_once(self):
        draft = TinyModel()
        draft.embed, draft.lm_head = self.model.embed, self.model.lm_head
        shadow = ShadowParameters([self.model, draft])
        qkv_bytes = (Q + 2 * KV) * HIDDEN * 4
        self.assertEqual(shadow.nbytes, VOCAB * HIDDEN * 2 + 2 * qkv_bytes)
        shadow.begin()
        new = torch.full((VOCAB, HIDDEN), 5.0, dtype=torch.bfloat16)
        shadow.load([("embed.weight", new), ("v_proj.weight", torch.ones(KV, HIDDEN))])
        shadow.apply()
        self.assertIs(draft.embed.weight, self.model.embed.weight)
        self.assertTrue(torch.equal(draft.embed.weight, new))
        for model in (self.model, draft):  # each model's own loader ran
            self.assertTrue(
                torch.equal(model.qkv_proj.weight[Q + KV :], torch.ones(KV, HIDDEN))
            )

    def test_a_failed_update_leaves_live_weights_bit_identical(self):
        self.shadow.load([("q_proj.weight", torch.ones(Q, HIDDEN))])
        with self.assertRaises(KeyError):
            self.shadow.load([("no_such.weight", torch.ones(1))])
        self.assert_live_unchanged()

    def test_a_discarded_update_leaks_nothing_into_the_next(self):
        self.shadow.load([("q_proj.weight", torch.ones(Q, HIDDEN))])
        self.shadow.begin()  # the next update, the first one never applied
        self.shadow.load([("v_proj.weight", torch.zeros(KV, HIDDEN))])
        self.shadow.apply()
        weight, before = self.model.qkv_proj.weight, self.before["qkv_proj.weight"]
        self.assertTrue(torch.equal(weight[:Q], before[:Q]))
        self.assertTrue(torch.equal(weight[Q + KV :], torch.zeros(KV, HIDDEN)))

    def test_a_loader_that_replaces_instead_of_writing_fails_naming_it(self):
        model = MisbehavingModel()
        before = snapshot(model)
        shadow = ShadowParameters([model])
        for what, named in (
            ("replace_parameter", "parameter 'weight' of QKVLinear"),
            ("derive_attribute", "attribute 'derived' of QKVLinear"),
            ("replace_storage", "replaced a tensor's storage"),
        ):
            with self.subTest(what):
                shadow.begin()
                with self.assertRaises(ShadowLoadError) as caught:
                    shadow.load([(what, None)])
                self.assertIn(named, str(caught.exception))
                self.assertFalse(hasattr(model.qkv_proj, "derived"))
                self.assertIsInstance(model.qkv_proj.weight, ShardedParameter)
                for name, param in model.named_parameters():
                    self.assertTrue(torch.equal(param, before[name]), name)

    def test_a_live_parameter_changed_since_is_refused_before_the_apply(self):
        self.assertTrue(self.shadow.matches([self.model]))
        self.assertFalse(self.shadow.matches([TinyModel()]))
        self.model.qkv_proj.weight.data = torch.zeros(Q, HIDDEN)
        self.assertFalse(self.shadow.matches([self.model]))
        reason = self.shadow.check_appliable()
        self.assertIn(f"[{Q + 2 * KV}, {HIDDEN}]", reason)
        self.assertIn(f"[{Q}, {HIDDEN}]", reason)

    def test_host_placement_stages_and_applies_the_same(self):
        shadow = ShadowParameters([self.model], placement="host")
        shadow.begin()
        shadow.load([("q_proj.weight", torch.ones(Q, HIDDEN))])
        self.assert_live_unchanged()
        shadow.apply()
        self.assertTrue(
            torch.equal(self.model.qkv_proj.weight[:Q], torch.ones(Q, HIDDEN))
        )
        with self.assertRaises(AssertionError):
            ShadowParameters([self.model], placement="disk")

    def test_post_processed_layers_are_named(self):
        class Fp8LinearMethod:
            pass

        class UnquantizedLinearMethod:
            pass

        self.model.qkv_proj.quant_method = UnquantizedLinearMethod()
        self.assertIsNone(unsupported_post_processing([self.model]))
        self.model.qkv_proj.quant_method = Fp8LinearMethod()
        reason = unsupported_post_processing([self.model])
        self.assertIn("'qkv_proj' uses Fp8LinearMethod", reason)
        del self.model.qkv_proj.quant_method
        self.model.embed.use_intel_amx_backend = True
        self.assertIn("'embed'", unsupported_post_processing([self.model]))

    def test_experts_re_laid_out_for_their_kernels_are_refused(self):
        class UnquantizedFusedMoEMethod:
            use_flashinfer_trtllm_moe = False

        experts = self.model.qkv_proj
        experts.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 3))
        experts.quant_method = UnquantizedFusedMoEMethod()
        with mock.patch.dict(os.environ, {"SGLANG_USE_AITER": "0"}):
            self.assertIsNone(unsupported_post_processing([self.model]))
            experts.quant_method.use_flashinfer_trtllm_moe = True
            self.assertIn("TRT-LLM", unsupported_post_processing([self.model]))
            experts.quant_method = UnquantizedFusedMoEMethod()
            experts.quant_method.w13_swiglu_interleaved = True
            self.assertIn("interleaved", unsupported_post_processing([self.model]))
        experts.quant_method = UnquantizedFusedMoEMethod()
        with mock.patch.dict(os.environ, {"SGLANG_USE_AITER": "1"}):
            with mock.patch.object(torch.version, "hip", "6.4"):
                self.assertIn("aiter", unsupported_post_processing([self.model]))


class _Layers(nn.Module):
    def __init__(self, layers: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(dim, dim, bias=False, device="cuda", dtype=torch.float16)
            for _ in range(layers)
        )
        for layer in self.layers:
            nn.init.zeros_(layer.weight)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


@unittest.skipUnless(torch.cuda.is_available(), "needs a GPU")
class TestApplyWhileABatchRuns(CustomTestCase):
    """The overlapping scheduler takes a complete while a batch still runs on
    its forward stream: that forward reads the old weights only."""

    def test_a_running_forward_reads_none_of_the_update(self):
        model = _Layers(layers=16, dim=4096)
        shadow = ShadowParameters([model])
        x = torch.full((4096, 4096), 1 / 4096, device="cuda", dtype=torch.float16)
        forward_stream = torch.cuda.Stream()
        for _ in range(3):
            with torch.no_grad():
                for layer in model.layers:
                    layer.weight.zero_()
            shadow.begin()
            shadow.load(
                (name, torch.ones_like(param))
                for name, param in model.named_parameters()
            )
            torch.cuda.synchronize()
            outputs = []
            with torch.cuda.stream(forward_stream), torch.no_grad():
                for _ in range(40):  # long enough to still run at the apply
                    acc = torch.zeros_like(x)
                    for layer in model.layers:
                        acc += x @ layer.weight.t()
                    outputs.append(acc[0, 0])
            shadow.apply()
            torch.cuda.synchronize()
            self.assertEqual([float(o) for o in outputs], [0.0] * 40)
            self.assertTrue(all(bool((p == 1).all()) for p in model.parameters()))


if __name__ == "__main__":
    unittest.main()

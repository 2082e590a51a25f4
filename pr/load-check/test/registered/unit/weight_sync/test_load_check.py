"""Unit tests for the load check of a weight update — no server, no model
download; small torch modules with SGLang-style loaders stand in for models."""

import json
import os
import struct
import tempfile
import unittest

import torch

from sglang.srt.weight_sync.load_check import (
    LoadCheckError,
    check_declared_shapes,
    check_loadable,
    checkpoint_shapes,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=3, suite="base-a-test-cpu")


seen = []  # what the loaders ran, on which device (not undone: in place)


def default_weight_loader(param, loaded_weight):
    """As SGLang's: the whole tensor, of the parameter's size."""
    assert param.size() == loaded_weight.size(), (param.size(), loaded_weight.size())
    param.data.copy_(loaded_weight)


def stacked_weight_loader(param, loaded_weight, shard_id):
    """As a merged QKV layer's: q, k and v each fill two rows."""
    seen.append((param.device.type, shard_id))
    target = param.data.narrow(0, {"q": 0, "k": 2, "v": 4}[shard_id], 2)
    assert target.shape == loaded_weight.shape, (target.shape, loaded_weight.shape)
    target.copy_(loaded_weight)


class TinyModel(torch.nn.Module):
    """A loader in the style of SGLang's models: a stacked parameter filled
    shard by shard by its own weight_loader, tied embeddings, the default
    loader for the rest."""

    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
    ]

    def __init__(self, norm_dtype=torch.float32):
        super().__init__()
        self.qkv_proj = torch.nn.Linear(4, 6, bias=False)
        self.qkv_proj.weight.weight_loader = stacked_weight_loader
        self.norm = torch.nn.Parameter(
            torch.ones(4, dtype=norm_dtype), requires_grad=False
        )
        self.embed_tokens = torch.nn.Embedding(3, 4)
        self.lm_head = torch.nn.Linear(4, 3, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tie_word_embeddings

    def load_weights(self, weights):
        seen.append("load_weights")
        params_dict = dict(self.named_parameters())
        for name, loaded_weight in weights:
            if name == "lm_head.weight":  # tied
                continue
            for param_name, weight_name, shard_id in self.stacked_params_mapping:
                if weight_name in name:
                    param = params_dict[name.replace(weight_name, param_name)]
                    param.weight_loader(param, loaded_weight, shard_id)
                    break
            else:
                param = params_dict[name]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, loaded_weight)


GOOD = [
    ("q_proj.weight", torch.bfloat16, (2, 4)),
    ("k_proj.weight", torch.bfloat16, (2, 4)),
    ("v_proj.weight", torch.float32, (2, 4)),
    ("norm", torch.bfloat16, (4,)),
    ("embed_tokens.weight", torch.bfloat16, (3, 4)),
]


def snapshot(model):
    """Each parameter as (object, storage, values)."""
    return {
        name: (param, param.data_ptr(), param.detach().clone())
        for name, param in model.named_parameters(remove_duplicate=False)
    }


class TestLoadCheck(CustomTestCase):
    def setUp(self):
        seen.clear()

    def assertUntouched(self, model, before):
        after = dict(model.named_parameters(remove_duplicate=False))
        self.assertEqual(after.keys(), before.keys())
        for name, (param, ptr, values) in before.items():
            self.assertIs(after[name], param, name)
            self.assertEqual(param.data_ptr(), ptr, name)
            self.assertEqual(param.device.type, "cpu", name)
            self.assertTrue(torch.equal(param, values), name)

    def test_a_good_update_passes_and_no_real_parameter_is_touched(self):
        model = TinyModel()
        before = snapshot(model)
        self.assertIsNone(check_loadable(model, GOOD))
        self.assertUntouched(model, before)
        self.assertIs(model.lm_head.weight, model.embed_tokens.weight)
        self.assertIs(model.qkv_proj.weight.weight_loader, stacked_weight_loader)

    def test_the_loader_runs_on_meta_stand_ins_with_the_parameters_attributes(self):
        check_loadable(TinyModel(), GOOD)
        self.assertEqual(
            seen, ["load_weights", ("meta", "q"), ("meta", "k"), ("meta", "v")]
        )

    def test_a_rejected_tensor_is_named_by_its_position(self):
        cases = {
            0: [("q_proj.weight", torch.bfloat16, (3, 4)), *GOOD[1:]],
            2: [*GOOD[:2], ("v_proj.weight", torch.bfloat16, (2, 5)), *GOOD[3:]],
            3: [*GOOD[:3], ("no_such.weight", torch.bfloat16, (4,))],
        }
        for index, tensors in cases.items():
            with self.subTest(index=index):
                model = TinyModel()
                before = snapshot(model)
                with self.assertRaises(LoadCheckError) as ctx:
                    check_loadable(model, tensors)
                self.assertEqual(ctx.exception.index, index)
                self.assertEqual(ctx.exception.field, "shapes")
                self.assertIn(repr(tensors[index][0]), str(ctx.exception))
                self.assertUntouched(model, before)

    def test_dtypes_a_floating_point_model_cannot_take_are_refused_unloaded(self):
        for dtype in (torch.qint8, torch.complex64, torch.int8, torch.bool):
            with self.subTest(dtype=dtype):
                model = TinyModel()
                tensors = [GOOD[0], ("norm", dtype, (4,))]
                with self.assertRaises(LoadCheckError) as ctx:
                    check_loadable(model, tensors)
                self.assertEqual(
                    (ctx.exception.index, ctx.exception.field), (1, "dtypes")
                )
                self.assertEqual(seen, [])

    def test_integer_dtypes_go_to_a_model_with_integer_parameters(self):
        model = TinyModel(norm_dtype=torch.int8)
        self.assertIsNone(check_loadable(model, [("norm", torch.int8, (4,))]))
        with self.assertRaises(LoadCheckError) as ctx:
            check_loadable(model, [("norm", torch.quint8, (4,))])
        self.assertEqual(ctx.exception.field, "dtypes")

    def test_a_loader_that_needs_real_data_is_reported_not_refused(self):
        needs_data = {
            "item": lambda w: w.sum().item(),
            "copy to cpu": lambda w: w.cpu(),
            "tolist": lambda w: w.tolist(),
        }
        for what, use in needs_data.items():
            with self.subTest(what):

                class NeedsData(TinyModel):
                    def load_weights(self, weights):
                        for _, w in weights:
                            use(w)

                model = NeedsData()
                before = snapshot(model)
                note = check_loadable(model, GOOD)
                self.assertIn("could not be checked", note)
                self.assertUntouched(model, before)


class AssignsFromLoaded(torch.nn.Module):
    """A loader in the style of MLA models' post-load step, which computes
    from a loaded tensor and assigns the result to the model, then loads,
    and may need real data."""

    def __init__(self, needs_data):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.kv_b_proj = torch.nn.Linear(4, 4, bias=False)
        self.attn.w_scale = torch.ones(1)
        self.attn.register_buffer("w_kc", torch.zeros(4, 4))
        self.attn.rotary_emb = torch.nn.Identity()
        self.attn.use_fused = True
        self.needs_data = needs_data

    def load_weights(self, weights):
        # Cached on the model, as some SGLang loaders do.
        self._cached_params_dict = dict(self.named_parameters())
        for name, w in weights:
            attn = self.attn
            attn.w_scale = w.float().abs().amax().reshape(1)
            attn.w_kc = w.t().contiguous()
            attn.register_buffer("w_vc", w.clone())
            attn.extra = torch.nn.Parameter(w.clone(), requires_grad=False)
            attn.rotary_emb = torch.nn.Linear(4, 4, device="meta")
            attn.proj = torch.nn.Linear(4, 4, device="meta")
            attn.use_fused = False
            del attn.w_scale_inv
            default_weight_loader(self._cached_params_dict[name], w)
            if self.needs_data:
                w.sum().item()


def model_state(model):
    """Every module's attributes and parameter, buffer and submodule entries."""
    state = {}
    for module_name, module in model.named_modules():
        for key, value in vars(module).items():
            state[(module_name, key)] = value
            if key in ("_parameters", "_buffers", "_modules"):
                for entry, item in value.items():
                    state[(module_name, key, entry)] = item
    return state


class TestLoadCheckUndoesAssignments(CustomTestCase):
    def test_what_the_loader_assigns_to_the_model_is_undone(self):
        outcomes = {
            "accepted": ((4, 4), False),
            "needs data": ((4, 4), True),
            "rejected": ((4, 5), False),
        }
        for outcome, (shape, needs_data) in outcomes.items():
            with self.subTest(outcome):
                model = AssignsFromLoaded(needs_data)
                model.attn.w_scale_inv = torch.ones(1)
                before = model_state(model)
                tensors = [("attn.kv_b_proj.weight", torch.float32, shape)]
                if outcome == "rejected":
                    with self.assertRaises(LoadCheckError):
                        check_loadable(model, tensors)
                elif needs_data:
                    self.assertIsNotNone(check_loadable(model, tensors))
                else:
                    self.assertIsNone(check_loadable(model, tensors))
                after = model_state(model)
                self.assertEqual(after.keys(), before.keys())
                for key, value in before.items():
                    self.assertIs(after[key], value, key)
                for module in model.modules():
                    tensors_left = [
                        *module._parameters.values(),
                        *module._buffers.values(),
                        *(v for v in vars(module).values() if torch.is_tensor(v)),
                    ]
                    for tensor in tensors_left:
                        if tensor is not None:
                            self.assertNotEqual(tensor.device.type, "meta")
                self.assertTrue(torch.equal(model.attn.w_scale, torch.ones(1)))


def write_safetensors_header(path, shapes):
    """A safetensors file's header (the tensors' bytes are not needed)."""
    header = {"__metadata__": {"format": "pt"}}
    for name, shape in shapes.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)


class Lenient(torch.nn.Module):
    """A sharded loader narrows whatever it gets to its shard."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8, bias=False)

    def load_weights(self, weights):
        for _, w in weights:
            self.a.weight.data.copy_(w.narrow(0, 0, 8))


class LinearBase(torch.nn.Module):
    """Named as SGLang's base of linear layers, whose fused loaders pad or
    narrow whatever they get."""

    def __init__(self, rows):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(rows, 4), requires_grad=False)


class QKVParallelLinear(LinearBase):
    pass


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(6)
        self.norm = torch.nn.Parameter(torch.ones(6), requires_grad=False)


class TestDeclaredShapes(CustomTestCase):
    def setUp(self):
        checkpoint_shapes.cache_clear()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    def test_checkpoint_shapes_are_read_from_safetensors_headers(self):
        write_safetensors_header(f"{self.dir}/a.safetensors", {"a.weight": [8, 4]})
        write_safetensors_header(f"{self.dir}/b.safetensors", {"b": [3]})
        with open(f"{self.dir}/config.json", "w") as f:
            f.write("{}")
        self.assertEqual(checkpoint_shapes(self.dir), {"a.weight": (8, 4), "b": (3,)})
        self.assertEqual(checkpoint_shapes(os.path.join(self.dir, "missing")), {})
        self.assertEqual(checkpoint_shapes("org/model-on-the-hub"), {})

    def test_an_unreadable_header_gives_no_shapes(self):
        with open(f"{self.dir}/model.safetensors", "wb") as f:
            f.write(struct.pack("<Q", 100) + b"{")
        self.assertEqual(checkpoint_shapes(self.dir), {})

    def test_checkpoint_shapes_catch_a_wrong_shape_a_lenient_loader_accepts(self):
        write_safetensors_header(f"{self.dir}/model.safetensors", {"a.weight": [8, 4]})
        wrong = [("b", torch.float32, (1,)), ("a.weight", torch.float32, (9, 4))]
        self.assertIsNone(check_loadable(Lenient(), wrong[1:]))
        with self.assertRaises(LoadCheckError) as ctx:
            check_declared_shapes(Lenient(), self.dir, 1, wrong)
        self.assertEqual((ctx.exception.index, ctx.exception.field), (1, "shapes"))
        self.assertIn("[8, 4] in the served checkpoint, not [9, 4]", str(ctx.exception))
        right = [("a.weight", torch.float32, (8, 4))]
        self.assertIsNone(check_declared_shapes(Lenient(), self.dir, 1, right))

    def test_a_fused_linear_parameter_takes_its_full_shape_only(self):
        cases = [
            (1, (6, 4), True),
            (1, (3, 4), False),
            (2, (12, 4), True),
            (2, (6, 8), True),
            (2, (6, 4), True),
            (2, (7, 4), False),
            (2, (12, 8), False),
            (1, (24,), False),
        ]
        for tp_size, shape, ok in cases:
            with self.subTest(tp_size=tp_size, shape=shape):
                tensors = [
                    ("norm", torch.float32, (99,)),
                    ("qkv_proj.weight", torch.bfloat16, shape),
                ]
                if ok:
                    check_declared_shapes(Fused(), self.dir, tp_size, tensors)
                    continue
                with self.assertRaises(LoadCheckError) as ctx:
                    check_declared_shapes(Fused(), self.dir, tp_size, tensors)
                self.assertEqual(ctx.exception.index, 1)
                self.assertIn("cannot be its full shape", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()

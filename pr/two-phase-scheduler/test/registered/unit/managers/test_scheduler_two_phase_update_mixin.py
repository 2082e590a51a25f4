"""Unit tests for the scheduler's side of a two-phase weight update: the
session's state machine (prepare, complete, abort, fences on session ids) on
a one-rank scheduler stand-in with a small model — no server; a trainer
process broadcasts the buckets over a CPU gloo group."""

import multiprocessing as mp
import unittest
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqInput,
    CompleteWeightsUpdateReqInput,
    PrepareWeightsUpdateReqInput,
)
from sglang.srt.managers.scheduler_two_phase_update_mixin import (
    SchedulerTwoPhaseUpdateMixin,
)
from sglang.srt.weight_sync.digest import digest_bytes
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="base-a-test-cpu")

GROUP = "weight_update_group"
S1, S2 = "session-0000000001", "session-0000000002"


class TinyModel(nn.Module):
    """Loads by name, as SGLang's models do (`load_weights`)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 2)
        for param in self.parameters():
            param.requires_grad_(False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


class TiedModel(nn.Module):
    """The output head tied to the embedding, as SGLang's Llama ties them:
    one parameter, two names; the loader skips the head's (a trainer's
    state_dict names both)."""

    stacked_params_mapping = []

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.lm_head = self.embed
        self.embed.weight.requires_grad_(False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name == "lm_head.weight":
                continue
            params[name].data.copy_(tensor)


class OneRankScheduler(SchedulerTwoPhaseUpdateMixin):
    """What the mixin reads of a scheduler (two_phase_update_protocols.py),
    for TP rank 0 of a TP size of 1."""

    tp_rank = 0
    tp_size = 1
    dp_rank = 0

    def __init__(self, model: nn.Module, groups: dict):
        self.server_args = SimpleNamespace(
            dp_size=1,
            model_path="",
            skip_tokenizer_init=True,
            weight_update_staging="device",
            weight_update_staging_budget_mb=None,
            weight_update_health_deadline=600.0,
        )
        self.tp_worker = SimpleNamespace(
            model_runner=SimpleNamespace(device="cpu", model=model)
        )
        self.groups = groups
        self.idle = True
        self.flushes = 0
        self.versions = []

    @property
    def _update_groups(self):
        return self.groups

    def _request_sockets(self):
        return []

    def _refuse_beside_release_session(self):
        pass

    def _staged_models(self):
        return [self.tp_worker.model_runner.model]

    def _weight_sync_metrics_labels(self):
        return None

    def _record_applied_version(self, version):
        self.versions.append(version)

    def flush_cache(self):
        self.flushes += 1
        return True

    def is_fully_idle(self):
        return self.idle


def trainer(port, orders, acks):
    """Rank 0, in its own process: joins a new group or broadcasts a list of
    tensors on the latest one, as each order says."""
    store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=2)
    group = None
    while (order := orders.get()) is not None:
        if order == "new group":
            group = dist.new_group(backend="gloo")
        else:
            for tensor in order:
                dist.broadcast(tensor, src=0, group=group)
        acks.put("done")
    dist.destroy_process_group()


def packed(tensors):
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


class TestSchedulerTwoPhaseUpdate(CustomTestCase):
    """This process is rank 1 of each test's own gloo group, as an engine."""

    @classmethod
    def setUpClass(cls):
        ctx = mp.get_context("spawn")
        cls.orders, cls.acks = ctx.Queue(), ctx.Queue()
        store = dist.TCPStore(
            "127.0.0.1", 0, 2, True, timedelta(seconds=60), wait_for_workers=False
        )
        cls.trainer = ctx.Process(
            target=trainer, args=(store.port, cls.orders, cls.acks), daemon=True
        )
        cls.trainer.start()
        dist.init_process_group(
            "gloo", store=store, rank=1, world_size=2, timeout=timedelta(seconds=60)
        )

    @classmethod
    def tearDownClass(cls):
        if dist.is_initialized():
            cls.orders.put(None)
            dist.destroy_process_group()
        cls.trainer.join(30)
        if cls.trainer.is_alive():
            cls.trainer.kill()

    def setUp(self):
        super().setUp()
        self.orders.put("new group")
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
        self.assertEqual(self.acks.get(timeout=60), "done")
        self.model = TinyModel()
        self.old = {n: p.clone() for n, p in self.model.named_parameters()}
        self.new = {n: torch.randn_like(p) for n, p in self.model.named_parameters()}
        self.scheduler = OneRankScheduler(self.model, {GROUP: group})

    # The trainer's side ------------------------------------------------------

    def buckets(self, weights=None, digests=True):
        """One bucket per parameter, flattened, with its digest."""
        weights = self.new if weights is None else weights
        return [
            {
                "names": [name],
                "dtypes": [str(tensor.dtype)],
                "shapes": [list(tensor.shape)],
                **({"digest": digest_bytes(packed([tensor]))} if digests else {}),
            }
            for name, tensor in weights.items()
        ]

    def prepare(self, buckets=None, **fields):
        buckets = self.buckets() if buckets is None else buckets
        return self.scheduler.prepare_weights_update(
            PrepareWeightsUpdateReqInput(
                num_buckets=len(buckets),
                buckets=buckets,
                load_format="flattened_bucket",
                **fields,
            )
        )

    def send(self, weights=None):
        weights = self.new if weights is None else weights
        self.orders.put([packed([tensor]) for tensor in weights.values()])
        self.assertEqual(self.acks.get(timeout=60), "done")

    def complete(self, **fields):
        fields.setdefault("timeout", 30.0)
        return self.scheduler.complete_weights_update(
            CompleteWeightsUpdateReqInput(**fields)
        )

    def abort(self, **fields):
        return self.scheduler.abort_weights_update(AbortWeightsUpdateReqInput(**fields))

    # What serves -------------------------------------------------------------

    def assert_serving(self, weights):
        for name, param in self.model.named_parameters():
            self.assertTrue(torch.equal(param, weights[name]), name)

    def assert_no_session_open(self):
        out = self.complete()
        self.assertFalse(out.success)
        self.assertEqual(out.status_code, 409)
        self.assertIn("no weight update session is open", out.message)

    # The tests ---------------------------------------------------------------

    def test_complete_applies_every_bucket_and_the_old_weights_serve_until_then(self):
        ready = self.prepare(weight_version="v2")
        self.assertEqual(ready.status, "ready", ready.message)
        self.assertEqual(ready.num_bytes, sum(4 * p.numel() for p in self.new.values()))
        self.send()
        self.assert_serving(self.old)

        out = self.complete()
        self.assertTrue(out.success, out.message)
        self.assertTrue(out.applied)
        self.assertEqual(out.message, "applied 2 buckets and flushed the cache")
        self.assertEqual(out.weight_version, "v2")
        self.assertFalse(out.session_open)
        self.assert_serving(self.new)
        self.assertEqual((self.scheduler.flushes, self.scheduler.versions), (1, ["v2"]))
        self.assert_no_session_open()

    def test_an_update_that_fails_verification_applies_nothing(self):
        self.assertEqual(self.prepare().status, "ready")
        self.send({n: t + 1 for n, t in self.new.items()})  # not what was declared
        out = self.complete(session_id=None)
        self.assertFalse(out.success)
        self.assertFalse(out.applied)
        self.assertEqual(out.status_code, 400)
        self.assertIn("verification failed, nothing applied", out.message)
        self.assertFalse(out.session_open)
        self.assert_serving(self.old)
        self.assertEqual(self.scheduler.flushes, 0)

    def test_a_complete_after_the_session_ended_says_how_it_ended(self):
        self.assertEqual(self.prepare(session_id=S1).status, "ready")
        self.send()
        self.assertTrue(self.complete(session_id=S1).applied)
        again = self.complete(session_id=S1)
        self.assertFalse(again.success)
        self.assertEqual(again.status_code, 409)
        self.assertIn(f"session '{S1}' has ended (applied)", again.message)
        unnamed = self.complete()
        self.assertEqual(unnamed.status_code, 409)
        self.assertIn(f"'{S1}', has ended: applied", unnamed.message)
        self.assertEqual(self.scheduler.flushes, 1)

    def test_abort_keeps_the_old_weights_and_its_id_cannot_open_a_session(self):
        self.assertEqual(self.prepare(session_id=S1).status, "ready")
        self.send()
        out = self.abort(session_id=S1)
        self.assertTrue(out.success, out.message)
        self.assertEqual(out.message, "aborted; the served weights are unchanged")
        self.assertTrue(out.group_usable)
        self.assert_serving(self.old)
        late = self.complete(session_id=S1)
        self.assertEqual(late.status_code, 409)
        self.assertIn("has ended (aborted)", late.message)
        reused = self.prepare(session_id=S1)
        self.assertEqual((reused.status, reused.status_code), ("error", 409))
        self.assertIn(f"session_id: '{S1}' named an earlier session", reused.message)
        self.assertEqual(self.abort().status_code, 409)

    def test_calls_naming_another_session_change_nothing(self):
        self.assertEqual(self.prepare(session_id=S1).status, "ready")
        second = self.prepare(session_id=S2)
        self.assertEqual((second.status, second.status_code), ("error", 409))
        self.assertIn(f"already open for group '{GROUP}'", second.message)
        for call in (self.complete, self.abort):
            out = call(session_id=S2)
            self.assertFalse(out.success)
            self.assertEqual(out.status_code, 409)
            self.assertIn(f"no session '{S2}' was opened on this server", out.message)
            self.assertIn(f"'{S1}'", out.message)
        wrong_group = self.complete(group_name="another_group")
        self.assertEqual(wrong_group.status_code, 400)
        self.assertIn("group_name: the open session is for", wrong_group.message)

        self.send()
        out = self.complete(session_id=S1)
        self.assertTrue(out.applied, out.message)
        self.assertEqual(out.session_id, S1)
        self.assert_serving(self.new)

    def test_prepare_checks_everything_before_staging_anything(self):
        shape = self.buckets()
        shape[0]["shapes"] = [[3, 2]]
        unknown = self.buckets()
        unknown[1]["names"] = ["proj.scale"]
        cases = [
            (dict(group_name="no_such_group"), 400, "group_name: no update group"),
            (dict(buckets=shape), 400, "buckets[0].shapes[0]"),
            (dict(buckets=unknown), 400, "buckets[1].shapes[0]"),
            (dict(buckets=unknown), 400, "'proj.scale'"),
        ]
        for fields, status_code, field in cases:
            with self.subTest(fields=fields):
                out = self.prepare(**fields)
                self.assertEqual((out.status, out.status_code), ("error", status_code))
                self.assertIn(field, out.message)
        self.scheduler.server_args.weight_update_staging_budget_mb = 1e-6
        out = self.prepare()
        self.assertEqual((out.status, out.status_code), ("error", 413))
        self.assertIn("staging needs", out.message)
        self.assertIn("--weight-update-staging-budget-mb", out.message)
        self.assert_no_session_open()
        self.assert_serving(self.old)

    def test_a_tied_models_alias_is_a_name_prepare_knows(self):
        tied = TiedModel()
        self.scheduler = OneRankScheduler(tied, self.scheduler.groups)
        embedding = torch.randn(5, 3)
        sent = {"embed.weight": embedding, "lm_head.weight": embedding}
        ready = self.prepare(self.buckets(sent))
        self.assertEqual(ready.status, "ready", ready.message)
        self.send(sent)
        out = self.complete()
        self.assertTrue(out.applied, out.message)
        self.assertTrue(torch.equal(tied.embed.weight, embedding))

    def test_complete_before_the_buckets_arrive_leaves_the_session_open(self):
        self.assertEqual(self.prepare().status, "ready")
        polled = self.complete(scheduler_wait_s=0.01)
        self.assertFalse(polled.success)
        self.assertTrue(polled.pending)
        self.assertTrue(polled.session_open)
        timed_out = self.complete(timeout=0.05)
        self.assertFalse(timed_out.success)
        self.assertIn("timed out after", timed_out.message)
        self.assertIn("complete again or abort", timed_out.message)
        self.assertTrue(timed_out.session_open)
        self.assert_serving(self.old)

        self.send()
        out = self.complete()
        self.assertTrue(out.applied, out.message)
        self.assert_serving(self.new)

    def test_apply_false_verifies_and_a_later_complete_applies(self):
        self.assertEqual(self.prepare().status, "ready")
        self.send()
        verified = self.complete(apply=False)
        self.assertTrue(verified.success, verified.message)
        self.assertTrue(verified.ready_to_apply)
        self.assertFalse(verified.applied)
        self.assertTrue(verified.session_open)
        self.assert_serving(self.old)
        out = self.complete()
        self.assertTrue(out.applied, out.message)
        self.assert_serving(self.new)

    def test_a_cache_flush_waits_for_an_idle_scheduler(self):
        self.assertEqual(self.prepare().status, "ready")
        self.send()
        self.scheduler.idle = False
        refused = self.complete(flush_cache=True)
        self.assertFalse(refused.success)
        self.assertEqual(refused.status_code, 409)
        self.assertIn("flush_cache: requests are in flight", refused.message)
        drained = self.complete(flush_cache=True, drain=True)
        self.assertTrue(drained.pending)
        self.assertIn("drain: requests are in flight", drained.message)
        self.assertTrue(drained.ready_to_apply)
        self.assert_serving(self.old)
        self.assertEqual(self.scheduler.flushes, 0)

        self.scheduler.idle = True
        out = self.complete(flush_cache=True)
        self.assertTrue(out.applied, out.message)
        self.assertTrue(out.cache_flushed)
        self.assertEqual(self.scheduler.flushes, 1)

    def test_a_drain_waits_for_an_idle_scheduler_flush_or_not(self):
        """Requests another tokenizer worker sent reach the scheduler beside
        the drained ones: a drain waits for them too, verifying or applying."""
        self.assertEqual(self.prepare().status, "ready")
        self.send()
        self.scheduler.idle = False
        for apply in (False, True):
            drained = self.complete(drain=True, flush_cache=False, apply=apply)
            self.assertTrue(drained.pending, drained.message)
            self.assertIn("drain: requests are in flight", drained.message)
            self.assert_serving(self.old)
        self.scheduler.idle = True
        out = self.complete(drain=True, flush_cache=False)
        self.assertTrue(out.applied, out.message)
        self.assertFalse(out.cache_flushed)
        self.assert_serving(self.new)

    def test_by_default_a_busy_scheduler_applies_without_a_flush(self):
        self.assertEqual(self.prepare().status, "ready")
        self.send()
        self.scheduler.idle = False
        out = self.complete()
        self.assertTrue(out.applied, out.message)
        self.assertFalse(out.cache_flushed)
        self.assertEqual(out.message, "applied 2 buckets")
        self.assertEqual(self.scheduler.flushes, 0)
        self.assert_serving(self.new)


if __name__ == "__main__":
    unittest.main()

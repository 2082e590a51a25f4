"""Unit tests for the update group's name errors — no server, no process
group: the model runner's update groups are a dict here, and a rendezvous
(which these calls must never reach) fails at once instead of waiting."""

import dataclasses
import unittest
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede the model runner, which pulls in sgl_kernel

try:
    from sglang.srt.model_executor.model_runner_components import weight_updater

    OWNER = weight_updater.WeightUpdater
except ImportError:  # releases that keep the update groups on the model runner
    from sglang.srt.model_executor import model_runner

    OWNER = model_runner.ModelRunner

register_cpu_ci(est_time=10, suite="base-a-test-cpu")


def with_update_groups(groups: dict):
    """An OWNER at TP rank 0 whose update groups are `groups`, nothing else
    set up (no model, no device)."""
    if dataclasses.is_dataclass(OWNER):
        unset = {
            f.name: None
            for f in dataclasses.fields(OWNER)
            if f.init and f.name not in ("tp_rank", "_model_update_group")
        }
        return OWNER(**unset, tp_rank=0, _model_update_group=groups)
    owner = object.__new__(OWNER)
    owner.tp_rank, owner._model_update_group = 0, groups
    return owner


class TestUpdateGroupNameErrors(CustomTestCase):
    def setUp(self):
        self.live_group = object()
        self.owner = with_update_groups({"live": self.live_group})
        rendezvous = mock.patch(
            f"{OWNER.__module__}.init_custom_process_group",
            side_effect=AssertionError("a rendezvous was attempted"),
            create=True,
        )
        rendezvous.start()
        self.addCleanup(rendezvous.stop)
        initialized = mock.patch("torch.distributed.is_initialized", return_value=True)
        initialized.start()
        self.addCleanup(initialized.stop)

    def init(self, group_name):
        return self.owner.init_weights_update_group(
            master_address="127.0.0.1",
            master_port=29500,
            rank_offset=1,
            world_size=2,
            group_name=group_name,
            backend="gloo",
        )

    def test_an_empty_name_is_an_error_naming_the_field(self):
        # It was an assert on the scheduler: one request ended the server.
        success, message = self.init("")
        self.assertFalse(success)
        self.assertEqual(message, "group_name: must not be empty")

    def test_a_live_group_name_is_refused_at_once_and_the_group_kept(self):
        # It waited out a whole rendezvous that no trainer joins, then failed.
        success, message = self.init("live")
        self.assertFalse(success)
        self.assertIn("group_name: an update group 'live' already exists", message)
        self.assertIn("destroy it first", message)
        self.assertIs(self.owner._model_update_group["live"], self.live_group)

    def test_destroying_an_unknown_group_names_the_groups_there_are(self):
        success, message = self.owner.destroy_weights_update_group("nope")
        self.assertFalse(success)
        self.assertIn("group_name: no update group 'nope' on this server", message)
        self.assertIn("(groups: ['live'])", message)
        self.assertIn("/init_weights_update_group", message)
        self.assertIn("live", self.owner._model_update_group)


if __name__ == "__main__":
    unittest.main()

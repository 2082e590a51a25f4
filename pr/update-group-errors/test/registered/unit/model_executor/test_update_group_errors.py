"""Unit tests for the update group's name errors — no server, no process
group: the model runner's update groups are a dict here, and a rendezvous
(which these calls must never reach) fails at once instead of waiting."""

import importlib
import unittest
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede the model runner, which pulls in sgl_kernel

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

# Where the update groups live: the model runner's weight updater, or the
# model runner itself in releases before the weight updater was split out.
_OWNERS = (
    (
        "sglang.srt.model_executor.model_runner_components.weight_updater",
        "WeightUpdater",
    ),
    ("sglang.srt.model_executor.model_runner", "ModelRunner"),
)


def _owner_class():
    for module_name, class_name in _OWNERS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        if hasattr(getattr(module, class_name, None), "init_weights_update_group"):
            return getattr(module, class_name)
    raise unittest.SkipTest("no class keeps update groups in this release")


class TestUpdateGroupNameErrors(CustomTestCase):
    def setUp(self):
        owner_class = _owner_class()
        self.owner = object.__new__(owner_class)
        self.live_group = object()
        self.owner._model_update_group = {"live": self.live_group}
        self.owner.tp_rank = 0
        rendezvous = mock.patch(
            f"{owner_class.__module__}.init_custom_process_group",
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

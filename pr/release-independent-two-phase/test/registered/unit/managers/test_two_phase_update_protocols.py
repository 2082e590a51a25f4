"""Unit tests for the two-phase update's declared hooks: this release's
hooks define every method the Protocols declare — no server."""

import types
import unittest

from sglang.srt.managers import two_phase_update_protocols as protocols
from sglang.srt.managers.scheduler_two_phase_update_hooks import (
    SchedulerTwoPhaseUpdateHooks,
)
from sglang.srt.managers.tokenizer_two_phase_update_hooks import (
    TokenizerTwoPhaseUpdateHooks,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


def declared_methods(protocol: type) -> list:
    return [
        name
        for name, value in vars(protocol).items()
        if isinstance(value, (types.FunctionType, property))
        and not name.startswith("__")
    ]


class TestTwoPhaseUpdateProtocols(CustomTestCase):
    def test_the_scheduler_hooks_define_every_declared_method(self):
        declared = declared_methods(protocols.SchedulerTwoPhaseUpdateHooksProtocol)
        self.assertIn("_update_groups", declared)
        for name in declared:
            self.assertTrue(hasattr(SchedulerTwoPhaseUpdateHooks, name), name)

    def test_the_tokenizer_hooks_define_every_declared_method(self):
        declared = declared_methods(protocols.TokenizerTwoPhaseUpdateHooksProtocol)
        self.assertIn("_record_weight_version", declared)
        for name in declared:
            self.assertTrue(hasattr(TokenizerTwoPhaseUpdateHooks, name), name)

    def test_the_upstream_members_the_mixins_read_are_public(self):
        for members in (protocols.SchedulerMembers, protocols.TokenizerMembers):
            names = [*declared_methods(members), *members.__annotations__]
            self.assertTrue(names)
            self.assertEqual([n for n in names if n.startswith("_")], [])


if __name__ == "__main__":
    unittest.main()

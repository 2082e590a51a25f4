"""Unit tests for the two-phase update's declared hooks: this release's
hooks define every method the Protocols declare — no server, and no import
of the scheduler (its modules are read as source)."""

import ast
import types
import unittest
from pathlib import Path

from sglang.srt.managers import two_phase_update_protocols as protocols
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

MANAGERS = Path(protocols.__file__).parent


def declared_methods(protocol: type) -> list:
    return [
        name
        for name, value in vars(protocol).items()
        if isinstance(value, (types.FunctionType, property))
        and not name.startswith("__")
    ]


def defined_methods(module_file: str, class_name: str) -> set:
    tree = ast.parse((MANAGERS / module_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    raise AssertionError(f"{module_file} defines no {class_name}")


class TestTwoPhaseUpdateProtocols(CustomTestCase):
    def test_the_scheduler_hooks_define_every_declared_method(self):
        declared = declared_methods(protocols.SchedulerTwoPhaseUpdateHooksProtocol)
        self.assertIn("_update_groups", declared)
        defined = defined_methods(
            "scheduler_two_phase_update_hooks.py", "SchedulerTwoPhaseUpdateHooks"
        )
        self.assertEqual(sorted(set(declared) - defined), [])

    def test_the_tokenizer_hooks_define_every_declared_method(self):
        declared = declared_methods(protocols.TokenizerTwoPhaseUpdateHooksProtocol)
        self.assertIn("_record_weight_version", declared)
        defined = defined_methods(
            "tokenizer_two_phase_update_hooks.py", "TokenizerTwoPhaseUpdateHooks"
        )
        self.assertEqual(sorted(set(declared) - defined), [])

    def test_the_upstream_members_the_mixins_read_are_public(self):
        for members in (protocols.SchedulerMembers, protocols.TokenizerMembers):
            names = [*declared_methods(members), *members.__annotations__]
            self.assertTrue(names)
            self.assertEqual([n for n in names if n.startswith("_")], [])


if __name__ == "__main__":
    unittest.main()

"""Unit tests for the weight-update server argument checks — no server."""

import math
import types
import unittest

from sglang.srt.weight_sync.server_arg_checks import check_weight_update_args
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

DEFAULTS = dict(
    weight_update_health_deadline=600,
    weight_update_staging_budget_mb=None,
    weight_update_staging="device",
    weight_update_max_request_mb=16,
    weight_update_max_tensor_request_mb=2048,
)


def args(**changes):
    return types.SimpleNamespace(**(DEFAULTS | changes))


class TestWeightUpdateArgs(CustomTestCase):
    def test_the_defaults_and_positive_values_pass(self):
        check_weight_update_args(args())
        check_weight_update_args(
            args(weight_update_health_deadline=1.5, weight_update_staging_budget_mb=1)
        )
        check_weight_update_args(args(weight_update_staging="host"))

    def test_a_value_out_of_range_is_refused_naming_its_flag(self):
        for attribute in (
            "weight_update_health_deadline",
            "weight_update_staging_budget_mb",
            "weight_update_max_request_mb",
            "weight_update_max_tensor_request_mb",
        ):
            flag = "--" + attribute.replace("_", "-")
            for value in (0, -1, math.nan, math.inf, 1e303, 10**400, "10", True, [1]):
                with self.subTest(attribute=attribute, value=value):
                    with self.assertRaisesRegex(ValueError, f"^{flag}: expected"):
                        check_weight_update_args(args(**{attribute: value}))

    def test_values_too_small_or_too_large_to_use_are_refused(self):
        for attribute, value in (
            ("weight_update_health_deadline", 0.5),
            ("weight_update_health_deadline", 10**7),
            ("weight_update_max_request_mb", 1e-300),
            ("weight_update_staging_budget_mb", 2**31),
        ):
            with self.subTest(attribute=attribute, value=value):
                with self.assertRaisesRegex(ValueError, "expected .* from .* to "):
                    check_weight_update_args(args(**{attribute: value}))

    def test_a_message_shows_a_value_cut_short_or_only_its_type(self):
        for value, shown in (("x" * 10**6, "'" + "x" * 79), ([[[]]], "of type list")):
            with self.assertRaises(ValueError) as caught:
                check_weight_update_args(args(weight_update_max_request_mb=value))
            self.assertIn(shown, str(caught.exception))
            self.assertLess(len(str(caught.exception)), 200)

    def test_a_required_limit_left_unset_is_refused(self):
        with self.assertRaisesRegex(ValueError, "--weight-update-max-request-mb"):
            check_weight_update_args(args(weight_update_max_request_mb=None))

    def test_an_unknown_staging_placement_is_refused(self):
        with self.assertRaisesRegex(ValueError, "--weight-update-staging: expected"):
            check_weight_update_args(args(weight_update_staging="gpu"))


if __name__ == "__main__":
    unittest.main()

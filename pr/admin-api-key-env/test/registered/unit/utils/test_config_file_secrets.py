"""A key in a --config file must be a non-empty YAML string, and an option
left without a value is refused — no server; the server's own argument
parser and the config merger."""

import argparse
import os
import tempfile
import unittest

from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

try:
    from sglang.srt.utils import server_args_config_parser
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    CHECKS_SECRETS = hasattr(server_args_config_parser, "SECRET_SERVER_ARGS")
except ImportError:  # releases without config files
    CHECKS_SECRETS = False

register_cpu_ci(est_time=2, suite="base-a-test-cpu")


@unittest.skipUnless(CHECKS_SECRETS, "this release's config merger has no checks")
class TestConfigFileSecrets(CustomTestCase):
    def setUp(self):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        self.merger = ConfigArgumentMerger(parser)

    def merged(self, yaml_text: str):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(yaml_text)
        self.addCleanup(os.unlink, f.name)
        return self.merger.merge_config_with_args(["--config", f.name])

    def test_a_quoted_key_is_passed_on(self):
        args = self.merged('admin-api-key: "k1"\napi-key: "k2"\n')
        self.assertEqual(args, ["--admin-api-key", "k1", "--api-key", "k2"])

    def test_a_key_yaml_reads_as_something_else_is_refused(self):
        # Left empty, `~`, [~] and [] would become "None", "None", the key
        # "None" or no key; 0x1F the key "31"; `no` the key "false".
        for value in ("", "~", "[~]", "[]", "0x1F", "no", '"  "'):
            with self.subTest(value=value):
                with self.assertRaisesRegex(ValueError, "admin-api-key.*secret"):
                    self.merged(f"admin-api-key: {value}\n")

    def test_an_option_without_a_value_is_refused_naming_it(self):
        with self.assertRaisesRegex(ValueError, "'context-length' has no value"):
            self.merged("context-length:\n")


if __name__ == "__main__":
    unittest.main()

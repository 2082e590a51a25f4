"""The launch command a server keeps shows no secret flag's value, however
argparse matched the flag — no server; the server's own argument parser."""

import argparse
import unittest

from sglang.srt import server_args as server_args_module
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.redaction import REDACTED, SECRET_SERVER_ARGS
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

redact = getattr(server_args_module, "_redact_secret_flags", None)


def server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def shortest_abbreviation(parser: argparse.ArgumentParser, option: str) -> str:
    """The shortest prefix of `option` that argparse takes for it alone."""
    options = [o for a in parser._actions for o in a.option_strings]
    for end in range(3, len(option)):
        prefix = option[:end]
        if [o for o in options if o.startswith(prefix)] == [option]:
            return prefix
    return option


@unittest.skipIf(redact is None, "this release keeps no launch command")
class TestLaunchCommandSecrets(CustomTestCase):
    def setUp(self):
        self.parser = server_parser()

    def test_each_secret_flag_s_value_is_hidden_in_either_form(self):
        for dest in SECRET_SERVER_ARGS:
            flag = "--" + dest.replace("_", "-")
            with self.subTest(flag):
                self.assertEqual(
                    redact([flag, "s3cret"], self.parser), [flag, REDACTED]
                )
                self.assertEqual(
                    redact([f"{flag}=s3cret"], self.parser), [f"{flag}={REDACTED}"]
                )

    def test_an_abbreviated_secret_flag_is_hidden_too(self):
        for dest in SECRET_SERVER_ARGS:
            flag = shortest_abbreviation(self.parser, "--" + dest.replace("_", "-"))
            with self.subTest(flag):
                # argparse takes the abbreviation for the secret flag...
                parsed = self.parser.parse_args(["--model-path", "m", flag, "s3cret"])
                self.assertEqual(getattr(parsed, dest), "s3cret")
                # ...and so does the redaction.
                self.assertNotIn("s3cret", redact([flag, "s3cret"], self.parser))
                joined = redact([f"{flag}=s3cret"], self.parser)
                self.assertNotIn("s3cret", " ".join(joined))

    def test_other_arguments_stay_even_when_they_equal_a_secret(self):
        # Matched by flag, never by value: hiding an argument that equals
        # the key would tell which argument it equals.
        argv = ["--model-path", "k1", "--api-key", "k1", "--port", "30000"]
        self.assertEqual(
            redact(argv, self.parser),
            ["--model-path", "k1", "--api-key", REDACTED, "--port", "30000"],
        )


if __name__ == "__main__":
    unittest.main()

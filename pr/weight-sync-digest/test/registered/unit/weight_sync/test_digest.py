"""Unit tests for the bucket digest of two-phase weight updates — no server,
no model loading."""

import random
import struct
import unittest

import torch

from sglang.srt.weight_sync.digest import digest_bytes, digest_tensors
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=5, suite="base-a-test-cpu")

PRIME = (1 << 61) - 1


def reference_digest(data: bytes) -> str:
    """The documented formula, word by word in Python integers."""
    data += b"\0" * (-len(data) % 4)
    words = struct.unpack(f"<{len(data) // 4}i", data)
    s1 = sum(words) % PRIME
    s2 = sum((i + 1) * w for i, w in enumerate(words)) % PRIME
    return f"psum61:{s1:016x}:{s2:016x}"


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8)


class TestDigest(CustomTestCase):
    def test_matches_the_documented_formula(self):
        rng = random.Random(0)
        for size in (0, 1, 3, 4, 5, 4096, 65537):
            data = bytes(rng.randrange(256) for _ in range(size))
            self.assertEqual(digest_bytes(as_tensor(data)), reference_digest(data))

    def test_extreme_words(self):
        data = struct.pack("<4i", -(2**31), 2**31 - 1, -1, 0) * 1000
        self.assertEqual(digest_bytes(as_tensor(data)), reference_digest(data))

    def test_one_changed_byte_and_a_swap_change_the_digest(self):
        data = bytearray(random.Random(1).randbytes(1 << 16))
        before = digest_bytes(as_tensor(bytes(data)))
        changed = bytearray(data)
        changed[12345] ^= 1
        self.assertNotEqual(digest_bytes(as_tensor(bytes(changed))), before)
        swapped = bytearray(data)
        swapped[0:4], swapped[400:404] = data[400:404], data[0:4]
        if data[0:4] != data[400:404]:
            self.assertNotEqual(digest_bytes(as_tensor(bytes(swapped))), before)

    def test_tensors_digest_as_their_packed_bytes(self):
        tensors = [
            torch.arange(10, dtype=torch.float32),
            torch.ones(3, 5, dtype=torch.bfloat16),
            torch.tensor([1, 2, 3], dtype=torch.int8),
        ]
        packed = b"".join(
            t.contiguous().view(torch.uint8).numpy().tobytes() for t in tensors
        )
        self.assertEqual(digest_tensors(tensors), reference_digest(packed))


if __name__ == "__main__":
    unittest.main()

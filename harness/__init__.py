"""Test, demo and benchmark harness: the real SGLang server on a CPU-only machine."""

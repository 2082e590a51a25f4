"""Runnable examples of the rlsync library (`python -m examples.<name>`)."""

"""rlsync: race-free, all-or-nothing weight updates from an RL trainer into SGLang.

Importing the package is cheap; the trainer-side modules import torch lazily.
"""

# The weight-update series this library speaks: a server reports its own in
# `/rlsync_info`, and the forked wheel is `sglang==<version>+rlsync.<SERIES>`.
SERIES = 7
# SGLang releases the series exists for.
SGLANG_VERSIONS = ("0.5.10", "0.5.23")
__version__ = "0.7.0"  # 0.<SERIES>.<n>: checked by `make check`

"""rlsync: race-free, all-or-nothing weight updates from an RL trainer into SGLang.

Importing the package is cheap; the trainer-side modules import torch lazily.
"""

__version__ = "0.1.0"

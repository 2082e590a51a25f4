"""CPU shims for a release's server smoke (`make smoke RELEASE=...`), on the
server's PYTHONPATH only there: a release whose upstream code calls a CUDA-only
function on a path the smoke takes, with no CPU branch, gets it made a no-op
without a device. Never in `make test`: the pins' own code runs as shipped.

- torch.cuda.synchronize(): the weights checksum action of 0.5.12 to 0.5.22
  (the smoke's oracle) calls it unconditionally; 0.5.23 dropped the call.
"""

import torch

if not torch.cuda.is_available():
    torch.cuda.synchronize = lambda device=None: None

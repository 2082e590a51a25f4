"""`python -m rlsync` is the `rlsync` command."""

import sys

from rlsync.cli import main

sys.exit(main())

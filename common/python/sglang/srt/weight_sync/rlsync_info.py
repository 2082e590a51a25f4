"""What this build of SGLang supports for weight sync (`GET /rlsync_info`,
and the `rlsync` block of `/server_info`), so a trainer checks support
instead of probing endpoints.

The series number, the release it is made for and the features (one per
patch of the series that adds one) are written into `_series.py` when the
series is built into a tree: the wheel, or an applied checkout. A tree
without it (the patches alone, e.g. on a review branch) reports no
series and no features.
"""

from __future__ import annotations

from typing import Any, Dict

try:
    from sglang.srt.weight_sync._series import FEATURES, PIN, SERIES
except ImportError:
    SERIES, PIN, FEATURES = None, None, ()


def rlsync_info() -> Dict[str, Any]:
    return {
        "series": SERIES,
        "version": None if PIN is None else f"{PIN['version']}+rlsync.{SERIES}",
        "pin": None if PIN is None else dict(PIN),
        "features": list(FEATURES),
    }

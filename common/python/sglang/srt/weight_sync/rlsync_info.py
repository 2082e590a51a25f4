"""What this build of SGLang supports for weight sync (`GET /rlsync_info`,
and the `rlsync` block of `/server_info`), so a trainer checks support
instead of probing endpoints.

The series number, the release it is made for and the features (one per
patch of the series that adds one) are written into `_series.py` when the
series is built into a tree: the wheel, or an applied checkout. A tree
without it (the patches alone, e.g. on a review branch) reports no
series and no features.

`/server_info` (behind the API key) also says which torch, CUDA and NCCL
the server runs, so a trainer can check that its NCCL can join the
server's before an update group hangs; the route open to every caller
does not.
"""

from __future__ import annotations

from typing import Any, Dict

try:
    from sglang.srt.weight_sync._series import FEATURES, PIN, SERIES
except ImportError:
    SERIES, PIN, FEATURES = None, None, ()


def rlsync_info(with_runtime: bool = True) -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "series": SERIES,
        "version": None if PIN is None else f"{PIN['version']}+rlsync.{SERIES}",
        "pin": None if PIN is None else dict(PIN),
        "features": list(FEATURES),
    }
    if with_runtime:
        info.update(runtime_versions())
    return info


def runtime_versions() -> Dict[str, Any]:
    """torch's version, and the CUDA and NCCL it was built with (None where
    it has none)."""
    import torch

    nccl: Any = None
    try:
        nccl = torch.cuda.nccl.version()  # (2, 27, 5); an int before torch 2.2
    except Exception:  # torch built without NCCL
        pass
    if isinstance(nccl, tuple):
        nccl = list(nccl)
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl,
    }

"""What this build of SGLang supports for weight sync (`GET /rlsync_info`,
and the `rlsync` block of `/server_info`), so a trainer checks support
instead of probing endpoints."""

from __future__ import annotations

from typing import Any, Dict

# The rlsync patch series applied to this tree, and the release it is made for.
SERIES = 6
PIN = {"name": "sglang", "version": "0.5.10"}
FEATURES = (
    "watchdog_pause",  # 0001: blocking weight updates pause the watchdogs
    "init_weights_update_group_timeout",  # 0002
    "health_while_updating",  # 0003: bounded health-check bypass
    "two_phase_weight_update",  # 0004: prepare / complete / abort
    "weights_checksum",  # 0005: /weights_checker action "checksum"
    "admin_api_key_env",  # 0006: SGLANG_ADMIN_API_KEY
    "secret_redaction",  # 0006
    "rlsync_info",  # 0006
    "rank_results",  # 0007: admin weight operations answer every TP rank
    "idle_scheduler_yields_to_receiver",  # 0008
    "data_parallel_weight_update",  # 0010: every DP replica joins and applies
    "update_group_on_route",  # 0011: bound to the route to the master
)


def rlsync_info() -> Dict[str, Any]:
    return {
        "series": SERIES,
        "version": f"{PIN['version']}+rlsync.{SERIES}",
        "pin": dict(PIN),
        "features": list(FEATURES),
    }

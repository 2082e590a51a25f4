"""Checks of the weight-update server arguments, run before anything starts.

A deadline of 0 or less made every health check during an update a 503 at
once (and bounded every update group's collectives by it); a body limit of
0 refused every weight-update request; a negative staging budget refused
every prepare; NaN compared false everywhere. Each such value is refused at
start-up, naming the flag.
"""

from __future__ import annotations

import math
from typing import Any

# The arguments that must be a finite number > 0, and their unit.
_POSITIVE = {
    "weight_update_health_deadline": "seconds",
    "weight_update_staging_budget_mb": "MiB",
    "weight_update_max_request_mb": "MiB",
    "weight_update_max_tensor_request_mb": "MiB",
}
# Of those, the ones None leaves at their default (the device's free memory).
_OPTIONAL = {"weight_update_staging_budget_mb"}
STAGING_PLACEMENTS = ("device", "host")


def _flag(attribute: str) -> str:
    return "--" + attribute.replace("_", "-")


def check_weight_update_args(server_args: Any) -> None:
    """Raise ValueError naming the first weight-update flag out of range."""
    for attribute, unit in _POSITIVE.items():
        value = getattr(server_args, attribute)
        if value is None and attribute in _OPTIONAL:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0):
            raise ValueError(
                f"{_flag(attribute)}: expected a finite number of {unit} > 0, "
                f"got {value!r:.80}"
            )
    if server_args.weight_update_staging not in STAGING_PLACEMENTS:
        raise ValueError(
            f"--weight-update-staging: expected {' or '.join(STAGING_PLACEMENTS)}, "
            f"got {server_args.weight_update_staging!r:.80}"
        )

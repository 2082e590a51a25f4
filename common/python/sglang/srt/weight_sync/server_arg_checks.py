"""Checks of the weight-update server arguments, run before anything starts.

A deadline of 0 or less made every health check during an update a 503 at
once (and bounded every update group's collectives by it); a body limit of
0 refused every weight-update request; a negative staging budget refused
every prepare; NaN compared false everywhere; a huge body limit overflowed
into an error once the model had loaded, and a huge deadline failed every
update group's init. Each such value is refused at start-up, naming the
flag and the range it takes.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

_LIMIT_RANGE = "MiB from 0.0009765625 (1 KiB) to 1073741824 (1 PiB)"
# The numeric arguments: the range they take, and how a message says it.
# The deadline bounds process-group timeouts, which hold milliseconds in a C
# int (24 days); the limits are converted to bytes.
_RANGES = {
    "weight_update_health_deadline": (1, 10**6, "seconds from 1 to 1000000"),
    "weight_update_staging_budget_mb": (1, 2**30, "MiB from 1 to 1073741824 (1 PiB)"),
    "weight_update_max_request_mb": (2**-10, 2**30, _LIMIT_RANGE),
    "weight_update_max_tensor_request_mb": (2**-10, 2**30, _LIMIT_RANGE),
}
# Of those, the ones None leaves at their default (the device's free memory).
_OPTIONAL = {"weight_update_staging_budget_mb"}
STAGING_PLACEMENTS = ("device", "host")


def _flag(attribute: str) -> str:
    return "--" + attribute.replace("_", "-")


def _shown(value: Any) -> str:
    """The value as a message shows it: a number or a string, cut short; of
    anything else only its type."""
    if isinstance(value, (numbers.Number, str)):
        try:
            return repr(value)[:80]
        except ValueError:  # an int of more digits than Python prints
            pass
    return f"a value of type {type(value).__name__}"


def _in_range(value: Any, low: float, high: float) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and low <= value <= high
    except OverflowError:  # an int too large for a float
        return False


def check_weight_update_args(server_args: Any) -> None:
    """Raise ValueError naming the first weight-update flag out of range."""
    for attribute, (low, high, expected) in _RANGES.items():
        value = getattr(server_args, attribute)
        if value is None and attribute in _OPTIONAL:
            continue
        if not _in_range(value, low, high):
            raise ValueError(
                f"{_flag(attribute)}: expected {expected}, got {_shown(value)}"
            )
    if server_args.weight_update_staging not in STAGING_PLACEMENTS:
        raise ValueError(
            f"--weight-update-staging: expected {' or '.join(STAGING_PLACEMENTS)}, "
            f"got {_shown(server_args.weight_update_staging)}"
        )

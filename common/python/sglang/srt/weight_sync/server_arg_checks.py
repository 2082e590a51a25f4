"""Checks of the weight-update server arguments, run before anything starts.

A value a flag cannot use is refused at start-up, with a ValueError naming
the flag and the range it takes, instead of breaking every weight update
once the server runs.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

_LIMIT_RANGE = "MiB from 0.0009765625 (1 KiB) to 1073741824 (1 PiB)"
# The numeric arguments: the range they take, and how a message says it.
_RANGES = {
    # 0 or less made every health check during an update a 503 at once; inf
    # or NaN failed every blocking weight operation (a watchdog pause needs a
    # finite limit). At most 10**6 s (11.6 days), so that a timeout in
    # milliseconds drawn from it fits a C int.
    "weight_update_health_deadline": (1, 10**6, "seconds from 1 to 1000000"),
    # A negative budget refused every prepare; None: the device's free memory.
    "weight_update_staging_budget_mb": (1, 2**30, "MiB from 1 to 1073741824 (1 PiB)"),
    # Converted to bytes: 0 refused every weight-update request, and a huge
    # limit overflowed into an error once the model had loaded.
    "weight_update_max_request_mb": (2**-10, 2**30, _LIMIT_RANGE),
    "weight_update_max_tensor_request_mb": (2**-10, 2**30, _LIMIT_RANGE),
}
# Of those, the ones None leaves at their default.
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

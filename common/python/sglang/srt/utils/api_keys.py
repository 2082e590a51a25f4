"""What a key given to the server must be before it starts.

A blank --api-key, --admin-api-key or SGLANG_ADMIN_API_KEY is an unset
variable in a launch script, not a choice: it was taken as no key at all, and
every route answered without one. So are "None", '""' and "$API_KEY", which
launchers write for a key they do not have: keys anyone could guess.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Optional

# What a key reads as, once invisible characters and quotes are dropped, when
# it was never really given.
_PLACEHOLDERS = ("", "none", "null", "nil", "~")
_UNEXPANDED_VARIABLE = re.compile(r"\$\{?\w+\}?")


def refuse_blank_key(key: Optional[str], source: str) -> None:
    """ValueError naming `source` (never the key) when `key` is blank, a
    placeholder or an unexpanded variable; None (no key) passes."""
    if key is None:
        return
    visible = "".join(c for c in key if unicodedata.category(c)[0] not in "ZC")
    visible = visible.strip("'\"")
    if visible.lower() in _PLACEHOLDERS or _UNEXPANDED_VARIABLE.fullmatch(visible):
        raise ValueError(
            f"{source} is blank, None or an unexpanded variable: give the key, "
            "or leave it out to run without one."
        )

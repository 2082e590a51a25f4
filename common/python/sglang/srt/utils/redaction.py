"""Keep secrets out of every answer and log line that shows server arguments.

`/server_info` used to return `dataclasses.asdict(server_args)`, keys
included, to any caller, and the start-up log printed them.
"""

from __future__ import annotations

from typing import Any, Dict

# Server arguments that carry a secret.
SECRET_SERVER_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")
REDACTED = "<redacted>"


def redact_server_args(args: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of server arguments as a dict, each secret that is set replaced
    (an unset one stays None, so callers can still tell whether it is set)."""
    out = dict(args)
    for key in SECRET_SERVER_ARGS:
        if out.get(key):
            out[key] = REDACTED
    return out


def redacted_value_repr(name: str, value: Any) -> str:
    """repr() of the server argument `name`, or REDACTED for a secret that is
    set."""
    return REDACTED if name in SECRET_SERVER_ARGS and value else repr(value)

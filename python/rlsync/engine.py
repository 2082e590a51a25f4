"""One engine as the trainer and the router both describe it: its URL, its
TP and DP sizes (so its ranks in an update group) and the keys it takes.
Free of torch: the router imports it too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlsync import client


@dataclass(frozen=True)
class Engine:
    """One engine. `admin_key` goes to its admin routes; `api_key` (its
    `--api-key`) to its ordinary routes, and to its admin routes when it has
    no admin key. Neither is shown by repr()."""

    url: str
    tp_size: int = 1
    admin_key: Optional[str] = field(default=None, repr=False)
    api_key: Optional[str] = field(default=None, repr=False)
    # --dp-size: every DP replica's TP ranks join the update group
    dp_size: int = 1

    @classmethod
    def from_server(
        cls,
        url: str,
        *,
        admin_key: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = 10.0,
    ) -> "Engine":
        """The engine at `url`, its TP and DP sizes read from its
        `/server_info` (EngineError when it does not answer them)."""
        info = client.server_info(url, timeout=timeout, api_key=api_key)
        tp_size, dp_size = client.update_group_shape(url, info)
        return cls(
            url, tp_size=tp_size, admin_key=admin_key, api_key=api_key, dp_size=dp_size
        )

    @property
    def ranks(self) -> int:
        """The engine's ranks in the update group (dp_size * tp_size)."""
        return self.dp_size * self.tp_size

    @property
    def keys(self) -> dict[str, Optional[str]]:
        """The keyword arguments of an admin call in `rlsync.client`."""
        return {"admin_key": self.admin_key, "api_key": self.api_key}

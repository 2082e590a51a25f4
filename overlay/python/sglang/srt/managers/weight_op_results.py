"""Per-rank results of admin weight operations.

Every TP rank runs an admin weight operation (group init and destroy, the
updates from disk, tensor, IPC or a distributed group), but only rank 0's
outcome used to reach the caller: a failure on another rank was invisible.
The scheduler now gathers every rank's (success, message); the answer keeps
upstream's shape and adds `rank_results`.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Iterable, List


class RankedResult(tuple):
    """The tuple upstream returns (callers unpack it as before), carrying one
    result per TP rank in `rank_results`."""

    rank_results: List[Dict[str, Any]]

    def __new__(
        cls, values: Iterable[Any], rank_results: Iterable[Dict[str, Any]] = ()
    ):
        result = super().__new__(cls, tuple(values))
        result.rank_results = list(rank_results)
        return result


def rank_results_of(outputs: Iterable[Any]) -> List[Dict[str, Any]]:
    """Every rank's result from the outputs of all DP groups, ordered by DP
    rank then TP rank (DP groups answer in any order)."""
    results = [r for out in outputs for r in getattr(out, "rank_results", None) or []]
    return sorted(results, key=lambda r: (r.get("dp_rank", 0), r["rank"]))


def rank_label(result: Dict[str, Any]) -> str:
    """'TP rank 1', or 'DP rank 0 TP rank 1' under data parallelism."""
    label = f"TP rank {result['rank']}"
    if "dp_rank" in result:
        label = f"DP rank {result['dp_rank']} {label}"
    return label


def gather_rank_results(handler):
    """Scheduler handler decorator: the output reports every TP rank, and it
    fails if any rank failed, naming the rank."""

    @functools.wraps(handler)
    def wrapper(self, recv_req):
        output = handler(self, recv_req)
        results = self._gather_rank_results(
            {"success": bool(output.success), "message": str(output.message)}
        )
        failed = [r for r in results if not r["success"]]
        if failed and output.success:
            output.success = False
            output.message = f"{rank_label(failed[0])}: {failed[0]['message']}"
        output.rank_results = results
        return output

    return wrapper

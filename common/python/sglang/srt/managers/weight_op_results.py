"""Per-rank results of operations that every TP rank of a scheduler runs.

Every TP rank runs an admin weight operation, but only one rank's outcome
used to reach the caller: a failure on another rank was invisible. On the
scheduler side `gather_from_tp_ranks` collects every rank's result over the
TP CPU group; on the tokenizer side `rank_results_of` collects them from the
outputs and `RankedResult` carries them beside the tuple a method returns.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


def gather_from_tp_ranks(
    scheduler: Scheduler, result: Dict[str, Any]
) -> List[Dict[str, Any]]:
    """Every TP rank's `result`, each with its `rank` (and `dp_rank` under
    data parallelism), in rank order. A collective over the TP CPU group:
    every rank must call it."""
    result = {"rank": scheduler.tp_rank, **result}
    if scheduler.server_args.dp_size > 1:
        result["dp_rank"] = scheduler.dp_rank
    if scheduler.tp_size == 1:
        return [result]
    gathered: List[Optional[Dict[str, Any]]] = [None] * scheduler.tp_size
    torch.distributed.all_gather_object(gathered, result, group=scheduler.tp_cpu_group)
    return gathered


class RankedResult(tuple):
    """The (success, message) tuple (callers unpack it as before), carrying one
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
        return add_rank_results(self, handler(self, recv_req))

    return wrapper


def add_rank_results(scheduler: Scheduler, output: Any) -> Any:
    """`output` (with success and message) reporting every TP rank in
    `rank_results`, failed if any rank failed, naming the rank. A collective
    over the TP CPU group: every rank must call it. The slowest rank may still
    be in the operation: call it inside the operation's watchdog pause."""
    results = gather_from_tp_ranks(
        scheduler,
        {"success": bool(output.success), "message": str(output.message)},
    )
    failed = [r for r in results if not r["success"]]
    if failed and output.success:
        output.success = False
        output.message = f"{rank_label(failed[0])}: {failed[0]['message']}"
    output.rank_results = results
    return output

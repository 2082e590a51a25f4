"""What a two-phase sync holds at once, per engine rank and on the trainer,
and what the shard staging costs, against the series before it, in one run.

Four real servers of the same model run side by side on this pin: a TP 1 and
a TP 2 server of this series (each rank stages its shard plus two bucket
buffers) and the same two of "today", the series without the shard staging
(each rank staged the whole update), started from the tree `--today-tree`
names (`make bench-memory` builds it: the pin's worktree one commit back).
Rounds take turns between the four, so they see the same machine.

Per pin, in bench/results/memory-<pin>-<date>.json:
  model_bytes, bucket_bytes,
  tp1_staging_bytes, tp2_staging_bytes_per_rank (this series' prepare answer),
  today_staging_bytes_per_rank (the whole update, what today staged),
  trainer_peak_extra_bytes (sync_stream over a generator that makes each
    tensor when asked: the most bytes of its tensors alive at once),
  e2e_ratio_vs_today (median seconds of an atomic sync into the TP 2 server,
    this series / today),
  stall_ratio_vs_today (median `apply_seconds` of the applying complete, the
    time the scheduler runs no batch to apply, this series / today).

    .venv-<pin>/bin/python bench/memory.py --today-tree build/<pin>/today/python
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import weakref
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from harness.cpu_sglang import launch, sglang_version  # noqa: E402
from harness.tiny_model import make_tiny_model  # noqa: E402
from harness.trainer import gloo_sender  # noqa: E402
from harness.weights import perturbed  # noqa: E402
from rlsync import client  # noqa: E402
from rlsync.planner import plan_buckets  # noqa: E402
from rlsync.sender import WeightSender, broadcast_buckets  # noqa: E402
from rlsync.stream import specs_of  # noqa: E402


class AliveBytes:
    """Bytes of the tensors a generator made that are still alive, and the
    most there ever were."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def made(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        self.now += nbytes
        self.peak = max(self.peak, self.now)
        weakref.finalize(tensor.untyped_storage(), self._freed, nbytes)
        return tensor

    def _freed(self, nbytes: int) -> None:
        self.now -= nbytes


def made_on_demand(weights, alive: AliveBytes) -> Iterator[torch.Tensor]:
    for _, tensor in weights:
        yield alive.made(tensor.clone())


def staging_per_rank(url: str, sender: WeightSender, weights, bucket_bytes) -> dict:
    """The prepare answer's staging figures (this series), then the session
    ends with the served weights themselves."""
    buckets = plan_buckets(weights, bucket_bytes)
    answer = client.prepare_weights_update(
        url,
        [b.metadata() for b in buckets],
        group_name=sender.group_name,
        load_format="flattened_bucket",
    )
    broadcast_buckets(buckets, sender.group)
    client.complete_weights_update(url, group_name=sender.group_name)
    return {
        "staging_bytes": answer.staging_bytes,
        "per_rank": [r["staging_bytes"] for r in answer.extra["rank_staging_bytes"]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--today-tree", required=True, type=Path)
    ap.add_argument("--size", default="demo", help="harness model size")
    ap.add_argument("--bucket-mb", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    bucket_bytes = int(args.bucket_mb * 2**20)
    model = make_tiny_model(ROOT / "build" / "models", args.size)
    original = list(load_file(str(model / "model.safetensors")).items())
    model_bytes = sum(t.numel() * t.element_size() for _, t in original)
    versions = [perturbed(original, seed=s) for s in (1, 2)]
    logs = ROOT / "build" / "logs"
    today_env = {"RLSYNC_SGLANG_TREE": str(args.today_tree.resolve())}

    servers, senders = {}, {}
    try:
        for series, env in (("now", None), ("today", today_env)):
            for tp in (1, 2):
                servers[series, tp] = launch(
                    model,
                    logs / f"bench-memory-{series}-tp{tp}.log",
                    tp=tp,
                    env_overrides=env,
                    ready_timeout=600,
                )
                senders[series, tp] = gloo_sender(
                    servers[series, tp].url,
                    tp,
                    bucket_bytes,
                    f"bench_memory_{series}",
                    timeout=600,
                )
        staging = {
            tp: staging_per_rank(
                servers["now", tp].url, senders["now", tp], original, bucket_bytes
            )
            for tp in (1, 2)
        }
        seconds = {key: [] for key in servers}
        apply_seconds = {key: [] for key in servers}
        for r in range(args.rounds):
            weights = versions[r % 2]
            for key, sender in senders.items():
                result = sender.sync(weights, weight_version=f"r{r}", atomic=True)
                assert result.success, result.engines
                seconds[key].append(result.seconds)
                apply_seconds[key].append(
                    result.engines[0].answer.stats["apply_seconds"]
                )
        alive = AliveBytes()
        streamed = senders["now", 2].sync_stream(
            specs_of(original), made_on_demand(original, alive), atomic=True
        )
        assert streamed.success, streamed.engines
    finally:
        for sender in senders.values():
            sender.close()
        for server in servers.values():
            server.stop()

    def median(values: list[float]) -> float:
        return statistics.median(values[1:])  # steady state: the first is apart

    ring = 2 * max(b.nbytes for b in plan_buckets(original, bucket_bytes))
    result = {
        "pin": sglang_version(),
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
        },
        "model": args.size,
        "model_bytes": model_bytes,
        "bucket_bytes": bucket_bytes,
        "ring_bytes": ring,
        "tp1_staging_bytes": staging[1]["staging_bytes"],
        "tp2_staging_bytes_per_rank": staging[2]["per_rank"],
        "today_staging_bytes_per_rank": model_bytes,
        "tp2_staging_share_of_model": max(staging[2]["per_rank"]) / model_bytes,
        "tp2_target_bytes": 0.55 * model_bytes + ring,
        "trainer_peak_extra_bytes": alive.peak,
        "trainer_target_bytes": int(2 * bucket_bytes * 1.05),
        "seconds": {f"{s}_tp{tp}": v for (s, tp), v in seconds.items()},
        "apply_seconds": {f"{s}_tp{tp}": v for (s, tp), v in apply_seconds.items()},
        "e2e_ratio_vs_today": median(seconds["now", 2]) / median(seconds["today", 2]),
        "e2e_ratio_vs_today_tp1": median(seconds["now", 1])
        / median(seconds["today", 1]),
        "stall_ratio_vs_today": median(apply_seconds["now", 2])
        / median(apply_seconds["today", 2]),
        "stall_ratio_vs_today_tp1": median(apply_seconds["now", 1])
        / median(apply_seconds["today", 1]),
    }
    out = ROOT / "bench" / "results" / f"memory-{result['pin']}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if "seconds" not in k}, indent=2))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What examples/rl_loop.py reports: the table per step, the JSON results and
the plot (matplotlib, imported only when plotting)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from examples.rl_loop import LoopResult, StepRecord

TABLE_HEADER = (
    f"{'step':>4}  {'reward':>6}  {'loss':>7}  {'sync s':>6}  "
    f"{'tokens in sync':>14}  {'staleness mean/max':>18}  versions"
)


def table_row(record: StepRecord) -> str:
    sync = "-" if record.sync_seconds is None else f"{record.sync_seconds:.2f}"
    staleness = f"{statistics.mean(record.staleness):.2f}/{max(record.staleness)}"
    versions = ",".join(map(str, sorted(set(record.versions))))
    return (
        f"{record.step:>4}  {record.reward:>6.3f}  {record.loss:>7.3f}  {sync:>6}  "
        f"{record.tokens_during_sync:>14}  {staleness:>18}  {versions}"
    )


def summary(result: LoopResult) -> dict[str, Any]:
    """One run's figures, with their per-step lists."""
    steps = result.steps
    syncs = [s.sync_seconds for s in steps if s.sync_seconds is not None]
    tokens_during_syncs = sum(s.tokens_during_sync for s in steps)
    return {
        "mode": "sync" if result.config.sync else "no-sync",
        "steps": len(steps),
        "reward_first": result.rewards[0],
        "reward_last": result.rewards[-1],
        "sync_seconds_median": statistics.median(syncs) if syncs else None,
        "sync_bytes": max((s.sync_bytes or 0) for s in steps),
        "staleness_max": max(max(s.staleness) for s in steps),
        "lost_requests": len(result.failures),
        "tokens_during_syncs": tokens_during_syncs,
        "tokens_generated": result.tokens,
        "tokens_per_second": result.tokens / result.seconds,
        "tokens_per_second_during_syncs": (
            tokens_during_syncs / sum(syncs) if syncs else None
        ),
        "rollout_requests": result.requests,
        "rollouts_unused": result.rollouts_unused,
        "published_versions": result.published,
        "unpublished_versions_seen": sorted(result.unpublished_versions),
        "seconds": result.seconds,
        "per_step": {
            "reward": result.rewards,
            "loss": [s.loss for s in steps],
            "sync_seconds": [s.sync_seconds for s in steps],
            "tokens_during_sync": [s.tokens_during_sync for s in steps],
            "staleness_mean": [statistics.mean(s.staleness) for s in steps],
            "staleness_max": [max(s.staleness) for s in steps],
            "versions": [sorted(set(s.versions)) for s in steps],
            "seconds": [s.seconds for s in steps],
        },
        "failures": result.failures,
        "config": dataclasses.asdict(result.config),
        "engines": [{"url": e.url, "tp_size": e.tp_size} for e in result.engines],
    }


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    names = [line.split(":", 1)[1].strip() for line in lines if "model name" in line]
    return names[0] if names else platform.processor()


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "sglang": version("sglang"),
        "rlsync": version("rlsync"),
    }


def results_json(
    trained: Optional[LoopResult], control: Optional[LoopResult], model_dir: Path
) -> dict[str, Any]:
    """The synced run's summary at the top level (the control's when it is the
    only run), the control's under "control"."""
    main_run = trained or control
    assert main_run is not None
    out = summary(main_run)
    if trained is not None and control is not None:
        out["control"] = summary(control)
    tokens = main_run.config.completion_tokens
    out["task"] = f"reward = share of digit tokens in a {tokens}-token completion"
    out["model"] = model_dir.name
    out["date"] = datetime.date.today().isoformat()
    out["machine"] = machine()
    return out


def plot(
    trained: Optional[LoopResult], control: Optional[LoopResult], path: Path
) -> None:
    """Reward, sync time, staleness and tokens generated during syncs by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    main_run = trained or control
    assert main_run is not None
    records = main_run.steps
    steps = [r.step for r in records]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (ax_reward, ax_sync), (ax_stale, ax_tokens) = axes
    for run, label, style in ((trained, "synced", "o-"), (control, "no sync", "s--")):
        if run is not None:
            ax_reward.plot([r.step for r in run.steps], run.rewards, style, label=label)
    ax_reward.set(title="reward: share of digits in rollouts", xlabel="step")
    ax_reward.set_ylim(0, 1.02)
    ax_reward.legend()

    mb = max((r.sync_bytes or 0) for r in records) / 1e6
    ax_sync.bar(steps, [r.sync_seconds or 0 for r in records], color="C2")
    ax_sync.set(
        title=(
            f"sync time ({mb:.1f} MB, atomic, every server)"
            if mb
            else "sync time: no syncs (control)"
        ),
        xlabel="step",
        ylabel="seconds",
    )

    bottom = [0] * len(records)
    for lag in range(max(max(r.staleness) for r in records) + 1):
        counts = [r.staleness.count(lag) for r in records]
        ax_stale.bar(steps, counts, bottom=bottom, label=str(lag))
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax_stale.set(title="samples by staleness (versions behind)", xlabel="step")
    ax_stale.set_ylim(0, 1.3 * max(bottom))
    ax_stale.legend(loc="upper center", ncol=4, fontsize="small")

    ax_tokens.bar(steps, [r.tokens_during_sync for r in records], color="C4")
    ax_tokens.set(title="tokens generated during each sync", xlabel="step")

    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    servers = " + ".join(f"TP {e.tp_size}" for e in main_run.engines)
    after = "go on during every sync" if trained else "never see new weights"
    fig.suptitle(
        f"rlsync RL loop: a tiny Llama learns to answer in digits; "
        f"rollouts on {servers} (CPU) {after}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)

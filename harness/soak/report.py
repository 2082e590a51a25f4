"""The soak's results: the machine it ran on, a row per sync as it goes,
and the summary."""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import torch


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sglang": metadata.version("sglang"),
        # The version names a series; this names the files installed under it.
        "sglang_record_sha256": hashlib.sha256(
            (metadata.distribution("sglang").read_text("RECORD") or "").encode()
        ).hexdigest()[:16],
        "platform": platform.platform(),
    }


def print_row(rec: dict[str, Any]) -> None:
    if rec["sync"] == 1:
        print(
            f"{'sync':<5} {'fault':<23} {'flush':<6} {'set':<4} {'seconds':<8} "
            f"{'requests ok/err/lost':<21} {'tp1':<6} {'tp2':<6} {'group':<8} result",
            flush=True,
        )
    req = rec["requests"]
    weights = [rec["checks"].get(n, {}).get("weights", "?") for n in ("tp1", "tp2")]
    result = "ok" if not rec["failures"] else f"FAILED ({len(rec['failures'])})"
    print(
        f"{rec['sync']:<5} {rec['fault']:<23} {str(rec['flush_cache']).lower():<6} "
        f"{rec['set']:<4} {rec['seconds']:<8.1f} "
        f"{str(req['ok']) + '/' + str(req['error']) + '/' + str(req['lost']):<21} "
        f"{weights[0]:<6} {weights[1]:<6} "
        f"{'kept' if rec.get('group_kept') else 're-init':<8} {result}",
        flush=True,
    )


def print_summary(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(
        f"\nsoak: {report['syncs']}/{report['syncs_asked']} syncs, seed {report['seed']}, "
        f"{report['seconds']:.0f} s on {m['cpu']} ({m['cores']} cores)"
    )
    print(
        "faults: "
        + ", ".join(f"{k} {v}" for k, v in report["faults"].items())
        + f"; flush_cache true {report['flush_cache']['true']}, "
        f"false {report['flush_cache']['false']}"
    )
    print(
        f"requests: {report['completed_requests']} completed, {report['clean_errors']} "
        f"clean errors, {report['lost_requests']} lost; health 200: "
        + ", ".join(f"{k} {v}" for k, v in report["health_checks"].items())
    )
    growth = ", ".join(
        f"{k} {'n/a' if v is None else f'{v:+.1f} %'}"
        for k, v in report["rss_growth_pct"].items()
    )
    print(
        f"weights: {report['mixed_weights']} mixed; RSS growth: {growth}; server "
        f"restarts: {report['server_restarts']}"
    )
    print(
        "failed syncs by fault: "
        + ", ".join(
            f"{k} {report['failed_syncs_by_fault'][k]}/{v}"
            for k, v in report["faults"].items()
        )
    )

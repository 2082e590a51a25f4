"""The promises the soak checks on each server after every sync: alive and
healthy, serving, exactly the old or exactly the new weights (and what the
answers claimed matches), the weight version that goes with them, RSS."""

from __future__ import annotations

import time
from typing import Any

import requests

from harness.soak.common import brief
from harness.soak.faults import MUST_APPLY, keeps_group
from harness.soak.load import Outcome, generate
from harness.soak.servers import Slot
from rlsync import client

RSS_TOLERANCE_PCT = 10.0


def check_server(
    slot: Slot,
    kind: str,
    old: int,
    target: int,
    version: str,
    claimed: bool,
    rec: dict[str, Any],
    checksums: list[str],
    request_deadline: float,
) -> tuple[list[str], bool]:
    """The failures of one server after a sync, and whether it must be
    restarted (dead, unhealthy, not serving, or weights unknown).
    `checksums`: each weight set's on this server."""
    name, failures, broken = slot.name, [], False
    out: dict[str, Any] = {}
    rec["checks"][name] = out
    assert slot.server is not None
    if not slot.server.alive():
        failures.append(f"{name}: the server exited ({slot.server.proc.returncode})")
        return failures, True
    code, body = client.health_detail(slot.url, timeout=20)
    out["health"] = code
    if code != 200:
        failures.append(
            f"{name}: /health answered {code} after the sync: {brief(body)}"
        )
        broken = True
    t0 = time.monotonic()
    result, detail = generate(
        requests.Session(),
        slot.url,
        token_ids=slot.token_ids,
        stream=False,
        index=0,
        max_new=2,
        deadline_s=request_deadline,
    )
    out["probe"] = {
        "result": result,
        "detail": detail,
        "seconds": round(time.monotonic() - t0, 2),
    }
    if result != "ok":
        failures.append(f"{name}: a request after the sync did not complete: {detail}")
        broken = True
    try:
        checksum = client.weights_checksum(slot.url, timeout=60)["checksum"]
    except client.EngineError as e:
        failures.append(f"{name}: /weights_checker failed: {brief(e)}")
        return failures, True
    label = {checksums[old]: "old", checksums[target]: "new"}.get(checksum, "mixed")
    out["weights"] = label
    if label == "mixed":
        failures.append(
            f"{name}: serves neither the old (set {old}) nor the new "
            f"(set {target}) weights ({checksum}); the answers said "
            f"{'applied' if claimed else 'not applied'}: {why(rec, slot)}"
        )
        broken = True
    elif claimed and label == "old":
        failures.append(f"{name}: the answers say applied, but the old weights serve")
    elif not claimed and label == "new":
        failures.append(
            f"{name}: the answers say not applied, but the new weights serve"
        )
    if kind in MUST_APPLY and label != "new":
        failures.append(f"{name}: the sync did not apply ({why(rec, slot)})")
    elif kind not in MUST_APPLY and label == "new":
        failures.append(
            f"{name}: the {kind} fault was not caught: the new weights serve"
        )
    try:
        served_version = client.get_weight_version(slot.url)
    except client.EngineError as e:
        served_version = f"unreadable: {e}"
    want = version if label == "new" else slot.version
    out["weight_version"] = served_version
    if label != "mixed" and served_version != want:
        failures.append(
            f"{name}: weight_version is {served_version!r}, serving {label} "
            f"weights whose version is {want!r}"
        )
    if label == "new":
        slot.served, slot.version = target, version
    return failures, broken


def check_group_kept(rec: dict[str, Any]) -> list[str]:
    """A fault the trainer survives with every byte accounted for must not
    cost the update group (`group_usable` stays true everywhere)."""
    report = rec.get("trainer") or {}
    if not keeps_group(rec["fault"], rec["params"]) or "outcome" not in report:
        return []
    if report.get("needs_reconnect"):
        return [
            f"the {rec['fault']} fault cost the update group (re-initialised): "
            f"{why(rec, None)}"
        ]
    return []


def why(rec: dict[str, Any], slot: Slot | None) -> str:
    """The trainer's answers from `slot` (None: from any): the failed ones,
    else the last."""
    trainer = rec.get("trainer") or {}
    steps = trainer.get("steps", [])
    if slot is not None:
        steps = [s for s in steps if s["engine"] in (slot.url, "*")]
    bad = [s for s in steps if not s["ok"]] or steps[-1:]
    if not bad:
        return f"trainer: {brief(trainer, 300)}"
    return "; ".join(
        f"{s['step']}: HTTP {s.get('status')}: {s.get('message')}" for s in bad
    )


def check_rss(slot: Slot, rec: dict[str, Any], failures: list[str]) -> None:
    rss = slot.rss()
    rec.setdefault("rss_mb", {})[slot.name] = round(rss / 2**20, 1)
    if slot.rss_base is None:
        slot.rss_base = rss  # its level after its first sync
        return
    growth = (rss - slot.rss_base) / slot.rss_base * 100
    rec.setdefault("rss_growth_pct", {})[slot.name] = round(growth, 2)
    if abs(growth) > RSS_TOLERANCE_PCT:
        failures.append(
            f"{slot.name}: RSS {rss / 2**20:.0f} MiB is {growth:+.1f} % from "
            f"{slot.rss_base / 2**20:.0f} MiB after its first sync"
        )


def tally(window: list[Outcome]) -> dict[str, Any]:
    out: dict[str, Any] = {
        r: sum(o.result == r for o in window) for r in ("ok", "error", "lost")
    }
    errors = [f"{o.slot} {o.kind}: {o.detail}" for o in window if o.result == "error"]
    out["errors"] = list(dict.fromkeys(errors))[:10]
    return out

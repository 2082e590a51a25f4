"""The soak itself: servers, load and trainer up, calibration, one sync
per drawn fault with every promise checked after it, the results file.
See `harness.soak` for what it checks."""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file

from harness.cpu_sglang import BUILD, ROOT
from harness.soak.checks import check_group_kept, check_rss, check_server, tally
from harness.soak.common import SAMPLED, WEIGHT_SETS, Named, brief, weight_set
from harness.soak.faults import FAULTS, FaultPlanner, SyncPlan
from harness.soak.load import Load, generation_loop, health_loop
from harness.soak.report import machine, print_row, print_summary
from harness.soak.servers import Slot
from harness.soak.trainer import TrainerProcess
from harness.tiny_model import make_tiny_model
from rlsync import client
from rlsync.planner import plan_buckets


@dataclass
class SoakConfig:
    syncs: int = 30
    seed: int = 1
    faults: tuple[str, ...] = FAULTS
    flush_cache: str = "random"  # "random", "true" or "false"
    token_ids_on: str = "tp2"  # the server started with --skip-tokenizer-init
    streaming_clients: int = 2
    plain_clients: int = 2
    max_new_tokens: int = 8
    pause: float = 0.1  # seconds between one client's requests
    request_deadline: float = 60.0
    bucket_bytes: int = 32 << 10
    max_seconds: float = 3600.0
    max_requests_per_client: int = 100_000
    out: Optional[Path] = None
    dry_run: bool = False


class Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.machine = machine()  # the install the servers start from
        self.model = make_tiny_model(BUILD / "models", "test")
        self.weights_file = self.model / "model.safetensors"
        self.original: Named = list(load_file(str(self.weights_file)).items())
        self.bucket_sizes = [
            b.nbytes for b in plan_buckets(self.original, cfg.bucket_bytes)
        ]
        self.slots = [
            Slot(f"tp{tp}", tp, cfg.token_ids_on == f"tp{tp}", self.model)
            for tp in (1, 2)
        ]
        self.load = Load([s.name for s in self.slots])
        self.threads: list[threading.Thread] = []
        self.trainer: Optional[TrainerProcess] = None
        self.checksums: dict[str, list[str]] = {}
        self.records: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.setup: dict[str, Any] = {}
        # Outcomes and health checks after this (count, time) belong to no
        # sync (the load winding down); None until the syncs begin.
        self.end_mark: Optional[tuple[int, float]] = None

    # --- setup and teardown

    def _trainer_cfg(self) -> dict[str, Any]:
        return {
            "engines": [[s.url, s.tp] for s in self.slots],
            "weights": str(self.weights_file),
            "bucket_bytes": self.cfg.bucket_bytes,
            "log": str(BUILD / "logs" / "soak-trainer.log"),
        }

    def start(self) -> bool:
        """Servers, trainer, calibration, load; False (failures recorded) when
        the soak cannot begin."""
        with cf.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(s.start) for s in self.slots]
            for s, f in zip(self.slots, futures):
                try:
                    f.result()
                except Exception as e:
                    self.failures.append(
                        f"setup: {s.name} did not start: {brief(e, 3000)}"
                    )
        if self.failures:
            return False
        self.setup["servers_up_s"] = round(time.monotonic() - self.t0, 1)
        self.setup["rlsync_info"] = {
            s.name: client.rlsync_info(s.url) for s in self.slots
        }
        self.trainer = TrainerProcess(self._trainer_cfg())
        answer = self.trainer.call("connect")
        if not answer.get("ok"):
            self.failures.append(f"setup: the trainer could not connect: {answer}")
            self._collect_setup_logs()
            return False
        if not self.calibrate():
            self._collect_setup_logs()
            return False
        for slot in self.slots:
            streams = [True] * self.cfg.streaming_clients
            for stream in streams + [False] * self.cfg.plain_clients:
                self.threads.append(
                    threading.Thread(
                        target=generation_loop,
                        args=(self.load, slot, stream, self.cfg),
                        daemon=True,
                    )
                )
            self.threads.append(
                threading.Thread(
                    target=health_loop, args=(self.load, slot, self.cfg), daemon=True
                )
            )
        for t in self.threads:
            t.start()
        # The load flows on both servers before the first sync.
        with self.load.cond:
            flowing = self.load.cond.wait_for(
                lambda: all(
                    any(
                        o.slot == s.name and o.result == "ok"
                        for o in self.load.outcomes
                    )
                    for s in self.slots
                ),
                self.cfg.request_deadline * 2,
            )
        if not flowing:
            outcomes = self.load.since(0)[-8:]
            self.failures.append(
                f"setup: generation did not flow on both servers: {outcomes}"
            )
            self._collect_setup_logs()
            return False
        self.setup["ready_s"] = round(time.monotonic() - self.t0, 1)
        return True

    def _collect_setup_logs(self) -> None:
        """The servers' state and log lines, as the evidence of a failed setup."""
        self.setup["log_lines"] = {s.name: s.new_log_lines(40) for s in self.slots}
        self.setup["alive"] = {
            s.name: s.server is not None and s.server.alive() for s in self.slots
        }
        for slot in self.slots:
            lines = self.setup["log_lines"][slot.name]
            alive = "alive" if self.setup["alive"][slot.name] else "exited"
            self.failures.append(
                f"setup: {slot.name} ({alive}) logged: {' | '.join(lines) or 'nothing'}"
            )

    def calibrate(self) -> bool:
        """Every weight set's checksum on each server, measured by syncing it
        (atomic, no load, no fault) and checked against a sampled parameter;
        the checkpoint's must come back to its start-up value."""
        try:
            for slot in self.slots:
                self.checksums[slot.name] = [""] * WEIGHT_SETS
                self.checksums[slot.name][0] = client.weights_checksum(
                    slot.url, timeout=60
                )["checksum"]
            assert self.trainer is not None
            for k in [*range(1, WEIGHT_SETS), 0]:
                report = self.trainer.call(
                    "sync",
                    spec={
                        "set": k,
                        "fault": "none",
                        "params": {},
                        "flush_cache": False,
                        "version": f"calibrate-{k}",
                    },
                )
                if report.get("outcome") != "applied":
                    self.failures.append(
                        f"calibration: the sync of weight set {k} failed: "
                        f"{brief(report, 3000)}"
                    )
                    return False
                want = dict(weight_set(self.original, k))[SAMPLED].float()[:8].tolist()
                for slot in self.slots:
                    got = client.get_weights_by_name(slot.url, SAMPLED, truncate_size=8)
                    if torch.tensor(got).flatten().tolist() != want:
                        self.failures.append(
                            f"calibration: {slot.name}: {SAMPLED} is "
                            f"not weight set {k}'s"
                        )
                        return False
                    checksum = client.weights_checksum(slot.url, timeout=60)["checksum"]
                    if k == 0 and checksum != self.checksums[slot.name][0]:
                        self.failures.append(
                            f"calibration: {slot.name}: the checkpoint's "
                            "checksum did not come back after a round trip"
                        )
                        return False
                    self.checksums[slot.name][k] = checksum
            for slot in self.slots:
                if len(set(self.checksums[slot.name])) != WEIGHT_SETS:
                    self.failures.append(
                        f"calibration: {slot.name}: two weight sets share a checksum"
                    )
                    return False
                slot.served, slot.version = 0, "calibrate-0"
        except Exception as e:
            self.failures.append(f"calibration: {type(e).__name__}: {brief(e, 2000)}")
            return False
        return True

    def teardown(self) -> None:
        self.load.shutdown()
        for t in self.threads:
            t.join(self.cfg.request_deadline + 15)
        if self.trainer is not None:
            self.trainer.close()
        for s in self.slots:
            if s.server is not None:
                s.server.stop()

    # --- one sync

    def restart(self, slot: Slot, why: str) -> dict[str, Any]:
        """Stop and start one server on its port, as an operator would: no new
        request is routed to it meanwhile, those in flight finish first."""
        assert slot.server is not None
        t0 = time.monotonic()
        drained = self.load.close_gate(slot.name, self.cfg.request_deadline + 15)
        port = slot.server.port
        out: dict[str, Any] = {"server": slot.name, "why": why, "drained": drained}
        try:
            slot.server.stop()
            out["stop_s"] = round(time.monotonic() - t0, 1)
            slot.start(port)
            out["ok"] = True
        except Exception as e:
            out.update(ok=False, error=brief(e, 3000))
        finally:
            self.load.open_gate(slot.name)
        out["seconds"] = round(time.monotonic() - t0, 1)
        return out

    def trainer_command(self, rec: dict, key: str, cmd: str, **args: Any) -> dict:
        """Run a trainer command; a trainer that died or hung is replaced and
        reconnects, as a restarted trainer would."""
        assert self.trainer is not None
        answer = self.trainer.call(cmd, **args)
        rec[key] = answer
        if "died" in answer or "hung" in answer:
            self.trainer.kill()
            self.trainer = TrainerProcess(self._trainer_cfg())
            rec.setdefault("trainer_restarts", 0)
            rec["trainer_restarts"] += 1
        return answer

    def run_sync(self, plan: SyncPlan) -> dict[str, Any]:
        cfg = self.cfg
        index, kind, flush, params = (
            plan.index,
            plan.kind,
            plan.flush_cache,
            plan.params,
        )
        old = {s.name: s.served for s in self.slots}
        if kind == "engine_restart":
            old[params["server"]] = 0  # a restarted server loads the checkpoint
        # A set neither server serves, so that old and new always differ.
        fresh_sets = [k for k in range(WEIGHT_SETS) if k not in old.values()]
        target = fresh_sets[int(plan.pick * len(fresh_sets))]
        version = f"soak-{index}-set{target}"
        rec: dict[str, Any] = {
            "sync": index,
            "fault": kind,
            "params": params,
            "flush_cache": flush,
            "set": target,
            "old_sets": old,
            "version": version,
        }
        failures: list[str] = []
        t_start = time.monotonic()
        mark = self.load.snapshot()
        slots = {s.name: s for s in self.slots}

        if kind == "engine_restart":
            restarted = self.restart(slots[params["server"]], "the fault")
            rec["restart"] = restarted
            if not restarted["ok"]:
                failures.append(
                    f"{params['server']}: did not come back: {restarted.get('error')}"
                )
            recovered = self.trainer_command(
                rec, "reconnect", "recover", reconnect=True
            )
            if not recovered.get("ok"):
                failures.append(
                    f"trainer: could not reconnect after the restart: "
                    f"{brief(recovered, 1500)}"
                )

        spec = {
            "set": target,
            "fault": kind,
            "params": params,
            "flush_cache": flush,
            "version": version,
        }
        report = self.trainer_command(rec, "trainer", "sync", spec=spec)
        fresh = "died" in report or "hung" in report
        if kind == "trainer_killed" and report.get("died") != -signal.SIGKILL:
            failures.append(
                f"trainer: expected to die by SIGKILL mid-broadcast, got {report}"
            )
        elif kind != "trainer_killed" and fresh:
            failures.append(f"trainer: {report}")
        elif "error" in report:
            failures.append(f"trainer: {report['error']}")
        claimed = {
            s.name: bool(report.get("applied", {}).get(s.url)) for s in self.slots
        }
        rec["claimed_applied"] = claimed
        rec["group_kept"] = not fresh and not report.get("needs_reconnect", True)
        failures += check_group_kept(rec)
        if fresh or report.get("outcome") != "applied":
            recovered = self.trainer_command(
                rec,
                "recovery",
                "recover",
                reconnect=fresh or bool(report.get("needs_reconnect")),
            )
            if not recovered.get("ok"):
                failures.append(f"trainer: recovery failed: {brief(recovered, 1500)}")

        rec["checks"] = {}
        broken: list[Slot] = []
        for slot in self.slots:
            slot_failures, is_broken = check_server(
                slot,
                kind,
                old[slot.name],
                target,
                version,
                claimed[slot.name],
                rec,
                self.checksums[slot.name],
                cfg.request_deadline,
            )
            failures += slot_failures
            if is_broken:
                broken.append(slot)

        settled = self.load.settle(time.monotonic(), cfg.request_deadline + 15)
        if not settled:
            failures.append("requests still in flight past their deadline")
        window = self.load.since(mark)
        t_end = time.monotonic()
        rec["requests"] = tally(window)
        for o in window:
            if o.result == "lost":
                failures.append(f"{o.slot}: {o.kind} request lost: {o.detail}")
        health = self.load.health_between(t_start, t_end)
        rec["health"] = {
            s.name: self.load.health_200(s.name, t_start, t_end) for s in self.slots
        }
        for name, _, code, body in health:
            if code != 200:
                failures.append(
                    f"{name}: /health answered {code} during the sync: {body}"
                )

        for slot in self.slots:
            check_rss(slot, rec, failures)
        rec["log_lines"] = {s.name: s.new_log_lines() for s in self.slots}
        if broken:
            # An operator restarts a server that fails its checks; the soak goes on.
            with cf.ThreadPoolExecutor(len(broken)) as pool:
                rec["repairs"] = list(
                    pool.map(lambda s: self.restart(s, "failed its checks"), broken)
                )
            recovered = self.trainer_command(
                rec, "repair_reconnect", "recover", reconnect=True
            )
            if not recovered.get("ok"):
                failures.append(
                    f"trainer: could not reconnect after the repair: "
                    f"{brief(recovered, 1500)}"
                )
        rec["failures"] = list(dict.fromkeys(failures))
        rec["seconds"] = round(time.monotonic() - t_start, 2)
        return rec

    # --- the run

    def plan(self) -> list[SyncPlan]:
        """Every sync's fault, drawn before the first one runs."""
        return FaultPlanner(
            self.cfg.seed,
            self.cfg.faults,
            self.original,
            self.bucket_sizes,
            [s.name for s in self.slots],
            self.cfg.flush_cache,
        ).plan(self.cfg.syncs)

    def run(self) -> None:
        plans = self.plan()
        if not self.start():
            return
        warmup = self.load.since(0)
        self.end_mark = (len(warmup), time.monotonic())
        self.failures += [
            f"setup: {o.slot}: {o.kind} request lost before the first sync: {o.detail}"
            for o in warmup
            if o.result == "lost"
        ]
        for plan in plans:
            index, kind = plan.index, plan.kind
            if time.monotonic() - self.t0 > self.cfg.max_seconds:
                self.failures.append(
                    f"stopped before sync {index}: past --max-seconds "
                    f"{self.cfg.max_seconds:.0f}"
                )
                break
            rec = self.run_sync(plan)
            self.records.append(rec)
            self.end_mark = (self.load.snapshot(), time.monotonic())
            self.failures += [f"sync {index} ({kind}): {f}" for f in rec["failures"]]
            print_row(rec)
            if any(s.server is None or not s.server.alive() for s in self.slots):
                self.failures.append(f"stopped after sync {index}: a server is down")
                self.load.shutdown()
                break

    def report(self) -> dict[str, Any]:
        outcomes, t_end = self.load.since(0), float("inf")
        if self.end_mark is not None:
            outcomes, t_end = outcomes[: self.end_mark[0]], self.end_mark[1]
        growth: dict[str, Optional[float]] = {}
        for slot in self.slots:
            values = [
                r["rss_growth_pct"][slot.name]
                for r in self.records
                if slot.name in r.get("rss_growth_pct", {})
            ]
            growth[slot.name] = max(values, key=abs) if values else None
        faults = {
            k: sum(r["fault"] == k for r in self.records) for k in self.cfg.faults
        }
        failed_kinds = {
            k: sum(r["fault"] == k and bool(r["failures"]) for r in self.records)
            for k in self.cfg.faults
        }
        return {
            "syncs": len(self.records),
            "syncs_asked": self.cfg.syncs,
            "seed": self.cfg.seed,
            "faults": faults,
            "failed_syncs_by_fault": failed_kinds,
            "flush_cache": {
                "true": sum(r["flush_cache"] for r in self.records),
                "false": sum(not r["flush_cache"] for r in self.records),
            },
            "lost_requests": sum(o.result == "lost" for o in outcomes),
            "clean_errors": sum(o.result == "error" for o in outcomes),
            "completed_requests": sum(o.result == "ok" for o in outcomes),
            "mixed_weights": sum(
                c.get("weights") == "mixed"
                for r in self.records
                for c in r["checks"].values()
            ),
            "health_checks": {
                s.name: self.load.health_200(s.name, 0.0, t_end) for s in self.slots
            },
            "rss_growth_pct": growth,
            "server_restarts": {s.name: max(s.launches - 1, 0) for s in self.slots},
            "seconds": round(time.monotonic() - self.t0, 1),
            "machine": self.machine,
            "servers": [
                {"name": s.name, "tp": s.tp, "skip_tokenizer_init": s.token_ids}
                for s in self.slots
            ],
            "config": dataclasses.asdict(self.cfg),
            "setup": self.setup,
            "checksums": self.checksums,
            "failures": self.failures,
            "log": self.records,
        }


def parse_args(argv: Optional[list[str]]) -> SoakConfig:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--syncs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default bench/results/soak-<date>.json)",
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated fault kinds to draw from: {','.join(FAULTS)}",
    )
    parser.add_argument(
        "--flush-cache", choices=("random", "true", "false"), default="random"
    )
    parser.add_argument(
        "--skip-tokenizer-init",
        choices=("tp1", "tp2", "none"),
        default="tp2",
        help="the server started token-in/token-out",
    )
    parser.add_argument("--streaming-clients", type=int, default=2)
    parser.add_argument("--plain-clients", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument(
        "--pause-ms", type=int, default=100, help="pause between a client's requests"
    )
    parser.add_argument("--request-deadline", type=float, default=60.0)
    parser.add_argument("--bucket-kb", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the faults a seed draws, run none"
    )
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"--faults: unknown {unknown}; choose from {','.join(FAULTS)}")
    if args.syncs < 1:
        parser.error("--syncs must be >= 1")
    return SoakConfig(
        syncs=args.syncs,
        seed=args.seed,
        faults=faults,
        flush_cache=args.flush_cache,
        token_ids_on=args.skip_tokenizer_init,
        streaming_clients=args.streaming_clients,
        plain_clients=args.plain_clients,
        max_new_tokens=args.max_new_tokens,
        pause=args.pause_ms / 1000,
        request_deadline=args.request_deadline,
        bucket_bytes=args.bucket_kb << 10,
        max_seconds=args.max_seconds,
        dry_run=args.dry_run,
        out=args.out,
    )


def main(argv: Optional[list[str]] = None) -> int:
    cfg = parse_args(argv)
    torch.set_num_threads(1)  # the servers need the cores more than we do
    soak = Soak(cfg)
    if cfg.dry_run:
        for plan in soak.plan():
            print(json.dumps(dataclasses.asdict(plan)))
        return 0
    try:
        soak.run()
    except BaseException as e:
        soak.failures.append(f"soak: {type(e).__name__}: {brief(e, 2000)}")
        if not isinstance(e, Exception):
            raise
    finally:
        soak.teardown()
    report = soak.report()
    out = cfg.out or ROOT / "bench" / "results" / f"soak-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_summary(report)
    print(f"results: {out}")
    if soak.failures:
        print(
            f"\nFAILED checks ({len(soak.failures)}):\n  " + "\n  ".join(soak.failures)
        )
        evidence = [
            f"sync {r['sync']} ({r['fault']}) {name}: {line}"
            for r in soak.records
            if r["failures"]
            for name, lines in r["log_lines"].items()
            for line in lines[:6]
        ]
        if evidence:
            print("\nserver log lines at the failed syncs:\n  " + "\n  ".join(evidence))
        return 1
    print("\nall checks held")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: an RL trainer pushing weights into two real SGLang servers.

Starts a TP 1 and a TP 2 patched server on the CPU, joins both in one gloo
update group as the trainer, keeps a client streaming generations and a
health checker polling, runs three two-phase syncs through `WeightSender`
(new weights, newer weights, the original weights back), checks each one,
prints a table, and shuts everything down. Exit code 0 only when every
check held.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import torch
from safetensors.torch import load_file

from harness.cpu_sglang import BUILD, Server, free_port, launch
from harness.tiny_model import make_tiny_model
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.sender import Engine, WeightSender

PROMPT = "The trainer says"
# Replicated on every TP rank, so the value read back is the whole tensor's head.
CHECKED_PARAM = "model.norm.weight"


@dataclass
class Timeline:
    """What the streaming client and the health checker saw, with times."""

    tokens: list[float] = field(default_factory=list)
    health: list[tuple[float, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def tokens_between(self, t0: float, t1: float) -> int:
        return sum(t0 <= t <= t1 for t in self.tokens)

    def health_between(self, t0: float, t1: float) -> tuple[int, int]:
        codes = [c for t, c in self.health if t0 <= t <= t1]
        return sum(c == 200 for c in codes), len(codes)


def stream_forever(url: str, line: Timeline) -> None:
    """Streaming generations on one server, one after another."""
    params = {"max_new_tokens": 64, "temperature": 0.8, "ignore_eos": True}
    i = 0
    while not line.stop.is_set():
        i += 1
        try:
            with requests.post(
                url + "/generate",
                json={"text": f"stream {i}", "stream": True, "sampling_params": params},
                stream=True,
                timeout=120,
            ) as resp:
                resp.raise_for_status()
                for raw in resp.iter_lines():
                    if raw.startswith(b"data:") and raw != b"data: [DONE]":
                        json.loads(raw[5:])
                        line.tokens.append(time.monotonic())
        except Exception as e:  # counted as a failed check
            line.errors.append(f"{url}: {type(e).__name__}: {e}")


def poll_health(url: str, line: Timeline) -> None:
    """/health_generate as an orchestrator would poll it, a few times a second,
    each check recorded at the time it was issued. The timeout is SGLang's
    own health-check timeout (20 s): on two busy cores a real check (outside
    an update) can take seconds."""
    while not line.stop.is_set():
        issued = time.monotonic()
        line.health.append((issued, client.health(url, generate=True, timeout=20)))
        line.stop.wait(0.05)


def start_servers(model: Path, logs: Path) -> list[Server]:
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(launch, model, logs / f"demo-tp{tp}.log", tp=tp)
            for tp in (1, 2)
        ]
        servers, errors = [], []
        for f in futures:
            try:
                servers.append(f.result())
            except Exception as e:
                errors.append(e)
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]
    return servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-mb", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the servers need the cores more than we do

    t_start = time.monotonic()
    model = make_tiny_model(BUILD / "models", "demo")
    original = list(load_file(str(model / "model.safetensors")).items())
    print(
        f"model: {model.name}, {sum(t.nbytes for _, t in original) / 1e6:.1f} MB "
        f"in {len(original)} tensors"
    )
    servers = start_servers(model, BUILD / "logs")
    urls = [s.url for s in servers]
    print(
        f"servers: {urls[0]} (TP 1), {urls[1]} (TP 2), up in "
        f"{time.monotonic() - t_start:.0f} s"
    )
    failures: list[str] = []
    rows: list[dict] = []
    line = Timeline()
    threads = [
        threading.Thread(target=fn, args=(url, line), daemon=True)
        for fn in (stream_forever, poll_health)
        for url in urls
    ]
    sender = WeightSender(
        [Engine(urls[0], 1), Engine(urls[1], 2)],
        master_port=free_port(),
        group_name="demo",
        backend="gloo",
        bucket_bytes=args.bucket_mb << 20,
    )
    try:
        sender.connect()
        before_out = [greedy(u, PROMPT) for u in urls]
        before_sum = [client.weights_checksum(u)["checksum"] for u in urls]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120  # the stream flows before the first sync
        while len(line.tokens) < 5 and not line.errors:
            if time.monotonic() > deadline:
                raise TimeoutError("the streams gave no tokens within 120 s")
            time.sleep(0.05)  # between polls
        # The last sync flushes the prefix cache (in-flight requests finish
        # first): by default a server applies in place and keeps its cache
        # when a stream's request is in flight, and the greedy check would
        # then reuse the prompt's KV from older weights.
        plan = [
            ("step-1", randomized(original, 1), None),
            ("step-2", randomized(original, 2), None),
            ("step-3 (original back)", original, True),
        ]
        sums = before_sum
        for version, weights, flush_cache in plan:
            t0 = time.monotonic()
            result = sender.sync(
                weights, weight_version=version, atomic=True, flush_cache=flush_cache
            )
            t1 = time.monotonic()
            checks = verify(
                urls,
                version,
                dict(weights),
                before_out,
                before_sum,
                sums,
                restored=weights is original,
            )
            sums = [client.weights_checksum(u)["checksum"] for u in urls]
            ok_health, n_health = line.health_between(t0, t1)
            rows.append(
                dict(
                    version=version,
                    mb=result.bytes / 1e6,
                    buckets=result.buckets,
                    calls=result.http_calls,
                    seconds=result.seconds,
                    gbps=result.gbps,
                    tokens=line.tokens_between(t0, t1),
                    health=f"{ok_health}/{n_health}",
                    checks="ok" if not checks else "FAILED",
                )
            )
            if not result.success:
                checks.append(f"not applied everywhere: {result.engines}")
            if n_health and ok_health != n_health:
                checks.append(f"health answered non-200 {n_health - ok_health} times")
            failures += [f"{version}: {c}" for c in checks]
        line.stop.set()
        for t in threads:
            t.join(130)
        failures += [f"stream: {e}" for e in line.errors]
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        line.stop.set()
        try:
            sender.close()
        except Exception:
            pass
        for s in servers:
            s.stop()

    print_table(rows)
    print(
        f"streamed tokens in all: {len(line.tokens)}; "
        f"health checks: {sum(c == 200 for _, c in line.health)}/{len(line.health)} "
        f"answered 200; total {time.monotonic() - t_start:.0f} s"
    )
    if failures:
        print("\nFAILED checks:\n  " + "\n  ".join(failures))
        return 1
    print("\nall checks held")
    return 0


def verify(
    urls, version, sent, before_out, before_sum, last_sum, restored
) -> list[str]:
    """What must hold after a sync on every server; the failed checks."""
    failed = []
    want = sent[CHECKED_PARAM].float().flatten()[:8].tolist()
    for i, url in enumerate(urls):
        if client.get_weight_version(url) != version:
            failed.append(
                f"{url}: weight_version is {client.get_weight_version(url)!r}"
            )
        got = client.get_weights_by_name(url, CHECKED_PARAM, truncate_size=8)
        if torch.tensor(got).flatten().tolist() != want:
            failed.append(f"{url}: {CHECKED_PARAM} is not what was sent")
        out = greedy(url, PROMPT)
        checksum = client.weights_checksum(url)["checksum"]
        if restored:
            if out != before_out[i]:
                failed.append(f"{url}: greedy output not restored")
            if checksum != before_sum[i]:
                failed.append(f"{url}: checksum not back to the original")
        else:
            if out == before_out[i]:
                failed.append(f"{url}: greedy output unchanged")
            if checksum == last_sum[i]:
                failed.append(f"{url}: checksum unchanged")
    return failed


# (heading, row key) of each column of the summary table.
TABLE_COLUMNS = [
    ("sync", "version"),
    ("MB", "mb"),
    ("buckets", "buckets"),
    ("HTTP calls", "calls"),
    ("seconds", "seconds"),
    ("GB/s", "gbps"),
    ("tokens streamed", "tokens"),
    ("health 200", "health"),
    ("checks", "checks"),
]


def print_table(rows: list[dict]) -> None:
    head, keys = zip(*TABLE_COLUMNS)
    fmt = {"mb": "{:.1f}", "seconds": "{:.3f}", "gbps": "{:.3f}"}
    cells = [[fmt.get(k, "{}").format(r[k]) for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


if __name__ == "__main__":
    sys.exit(main())

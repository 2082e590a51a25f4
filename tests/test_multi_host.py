"""The trainer and the engines on different hosts: each in a network namespace
of its own, joined by a bridge, with addresses from the test range and no
GLOO_SOCKET_IFNAME anywhere (this machine's host name resolves to 127.0.0.1,
so gloo left to itself advertises loopback). Real servers, a trainer process
in its own namespace driving WeightSender, the router on a third address.

The tests run in file order: the last one removes an engine's host."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import pytest
import requests

from harness import cpu_sglang, netns
from harness.cpu_sglang import free_port
from harness.router import RouterProc
from rlsync import client

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "logs"
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
TIMEOUT = 10  # the trainer's and the engines' group timeout, seconds

why_not = netns.available()
# Which address each side advertises is decided by the trainer library and,
# on the engines, by the module the series adds word for word on every
# release (update_group_net); a later pin's hook into the group join runs in
# every other server test.
pytestmark = [
    pytest.mark.skipif(why_not is not None, reason=str(why_not)),
    pytest.mark.release_independent,
    pytest.mark.needs("update_group_on_route", "init_weights_update_group_timeout"),
]


def wait_until(predicate, timeout: float, what: str):
    """predicate()'s first true value, polled; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except requests.RequestException:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def plain_env(**extra: str) -> dict[str, str]:
    """This environment without any interface variable."""
    env = {k: v for k, v in os.environ.items() if k not in IFNAME_VARIABLES}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def net():
    network = netns.TestNetwork()
    try:
        yield network
    finally:
        network.close()


@pytest.fixture(scope="module")
def hosts(net):
    return {label: net.add_host(label) for label in ("t", "e1", "e2")}


@pytest.fixture(scope="module")
def engines(request, net, hosts, tiny_model):
    """A TP 1 engine on host e1 and a TP 2 engine on host e2, started
    without any interface variable."""
    with pytest.MonkeyPatch.context() as env, ThreadPoolExecutor(2) as pool:
        for name in IFNAME_VARIABLES:
            env.delenv(name, raising=False)
        futures = {
            label: pool.submit(
                cpu_sglang.launch,
                tiny_model,
                LOGS / f"multi-host-{label}.log",
                tp=tp,
                netns_host=hosts[label],
            )
            for label, tp in (("e1", 1), ("e2", 2))
        }
        servers = {}
        for label, future in futures.items():
            try:
                servers[label] = future.result()
            except Exception:
                for server in servers.values():
                    server.stop()
                raise
    for server in servers.values():
        request.addfinalizer(server.stop)
    return servers


class NsTrainer:
    """harness.ns_trainer in the trainer's namespace, one JSON line a call."""

    def __init__(self, host: netns.Host, config: dict[str, Any], env=None):
        self.proc = subprocess.Popen(
            host.command(
                sys.executable, "-m", "harness.ns_trainer", json.dumps(config)
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(LOGS / f"ns-trainer-{config['group_name']}.log", "w"),
            text=True,
            cwd=ROOT,
            env=env or plain_env(PYTHONPATH=f"{ROOT}:{ROOT / 'python'}"),
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):  # gloo prints its own lines to stdout
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, message: Any) -> None:
        self.proc.stdin.write(
            (message if isinstance(message, str) else json.dumps(message)) + "\n"
        )
        self.proc.stdin.flush()

    def next(self, deadline_s: float) -> dict:
        answer = self.lines.get(timeout=deadline_s)
        assert answer is not None, f"the trainer exited ({self.proc.poll()})"
        return answer

    def call(self, op: str, deadline_s: float = 120, **args: Any) -> dict:
        self.send({"op": op, **args})
        return self.next(deadline_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("close", 60)
            except Exception:
                pass
        self.proc.kill()
        self.proc.wait(30)


def trainer_config(host, urls_and_ranks, tiny_model, **extra) -> dict[str, Any]:
    port = free_port()
    return {
        "engines": [{"url": u, "tp_size": tp} for u, tp in urls_and_ranks],
        "master_address": host.address,
        "master_port": port,
        "group_name": f"hosts_{port}",
        "timeout": TIMEOUT,
        "model": str(tiny_model),
        **extra,
    }


def checksum(url: str) -> str:
    return client.weights_checksum(url)["checksum"]


def generate(url: str) -> list[int]:
    resp = requests.post(
        url + "/generate",
        json={"text": "hosts", "sampling_params": {"max_new_tokens": 4}},
        timeout=60,
    )
    resp.raise_for_status()
    return resp.json()["output_ids"]


# --- the data plane crosses real interfaces ---------------------------------


def test_no_interface_variable_is_set_anywhere(engines, hosts):
    assert not any(os.environ.get(v) for v in IFNAME_VARIABLES)
    for server in engines.values():
        env = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in env if e.split(b"=")[0].decode() in IFNAME_VARIABLES]
    for label in ("e1", "e2"):
        assert engines[label].url.startswith(f"http://{hosts[label].address}:")


def test_sync_across_hosts_into_tp1_and_tp2(engines, hosts, tiny_model):
    urls = [(engines["e1"].url, 1), (engines["e2"].url, 2)]
    before = {u: checksum(u) for u, _ in urls}
    trainer = NsTrainer(hosts["t"], trainer_config(hosts["t"], urls, tiny_model))
    try:
        assert trainer.call("connect") == {"ok": True}
        synced = trainer.call("sync", seed=5, atomic=True)
        assert synced == {"ok": True, "applied": [True, True]}, synced
        assert all(checksum(u) != before[u] for u, _ in urls)
        restored = trainer.call("sync", seed=None, atomic=True)
        assert restored["ok"], restored
        assert {u: checksum(u) for u, _ in urls} == before
    finally:
        trainer.close()
    # Each engine bound the group to its own host's interface, chosen by route.
    for label in ("e1", "e2"):
        log = engines[label].log()
        assert "Gloo connectFullMesh failed" not in log


def test_a_wrong_interface_fails_within_the_timeout_and_says_what_to_set(
    engines, hosts, tiny_model
):
    """The trainer's user pins gloo to loopback (the failure a host name that
    resolves to 127.0.0.1 gives): the engine cannot reach the address the
    trainer advertises. Connect fails within the timeout, and the engine's
    answer names the master, its own address and the variable to set."""
    url = engines["e1"].url
    env = plain_env(PYTHONPATH=f"{ROOT}:{ROOT / 'python'}", GLOO_SOCKET_IFNAME="lo")
    config = trainer_config(hosts["t"], [(url, 1)], tiny_model)
    trainer = NsTrainer(hosts["t"], config, env=env)
    try:
        t0 = time.monotonic()
        answer = trainer.call("connect", deadline_s=3 * TIMEOUT + 30)
        took = time.monotonic() - t0
        assert not answer["ok"] and answer["step"] == "connect", answer
        assert took < 2 * TIMEOUT + 15, f"connect failed only after {took:.0f}s"
        error = answer["error"]
        assert f"master {hosts['t'].address}:{config['master_port']}" in error, error
        assert hosts["e1"].address in error and "GLOO_SOCKET_IFNAME" in error, error
    finally:
        trainer.close()
    # The engine serves on and a correct trainer joins afterwards.
    generate(url)
    trainer = NsTrainer(hosts["t"], trainer_config(hosts["t"], [(url, 1)], tiny_model))
    try:
        assert trainer.call("connect") == {"ok": True}
    finally:
        trainer.close()


def test_an_unreachable_master_fails_within_the_timeout(engines, hosts):
    """No trainer at the master address: the engine's init gives up within
    its timeout (not twice it), naming the master and the variable."""
    url = engines["e1"].url
    t0 = time.monotonic()
    with pytest.raises(client.EngineError) as failed:
        client.init_weights_update_group(
            url,
            master_address=hosts["t"].address,
            master_port=free_port(),
            rank_offset=1,
            world_size=2,
            group_name=f"nobody_{free_port()}",
            backend="gloo",
            timeout=5,
        )
    took = time.monotonic() - t0
    assert took < 5 + 5, f"init answered after {took:.1f}s"
    message = str(failed.value)
    assert f"nothing accepted a connection at {hosts['t'].address}" in message
    assert "GLOO_SOCKET_IFNAME" in message
    generate(url)


# --- the router on a third address ------------------------------------------


@pytest.fixture(scope="module")
def router(net, engines):
    proc = RouterProc(
        [engines["e1"].url, engines["e2"].url],
        "--health-interval",
        "1",
        host=net.address,
        env=plain_env(PYTHONPATH=str(ROOT / "python")),
        log_name="multi-host-router",
        ready_timeout=60,
    )
    try:
        wait_until(
            lambda: requests.get(proc.url + "/health", timeout=5).status_code == 200,
            60,
            "the router's /health to answer 200",
        )
        yield proc.url
    finally:
        proc.stop()


def test_sync_through_the_router_on_a_third_address(router, engines, hosts, tiny_model):
    urls = [engines["e1"].url, engines["e2"].url]
    before = [checksum(u) for u in urls]
    ranks = requests.get(router + "/server_info", timeout=10).json()["tp_size"]
    assert ranks == 3
    config = trainer_config(hosts["t"], [(router, ranks)], tiny_model)
    trainer = NsTrainer(hosts["t"], config)
    try:
        assert trainer.call("connect") == {"ok": True}
        synced = trainer.call("sync", seed=6, atomic=True, weight_version="r6")
        assert synced["ok"], synced
        assert all(checksum(u) != b for u, b in zip(urls, before))
        restored = trainer.call("sync", seed=None, atomic=True, weight_version="r0")
        assert restored["ok"], restored
        assert [checksum(u) for u in urls] == before
    finally:
        trainer.close()


# --- failures between hosts ---------------------------------------------------


def test_a_partition_mid_transfer_fails_names_the_step_and_recovers(
    net, engines, hosts, tiny_model
):
    url = engines["e1"].url
    before = checksum(url)
    config = trainer_config(hosts["t"], [(url, 1)], tiny_model)
    trainer = NsTrainer(hosts["t"], config)
    try:
        assert trainer.call("connect") == {"ok": True}
        trainer.send({"op": "sync", "seed": 7, "atomic": True, "hold_after_bucket": 1})
        assert trainer.next(120)["event"] == "holding"
        net.cut(hosts["t"])
        try:
            trainer.send("go")
            failed = trainer.next(6 * TIMEOUT + 60)
            assert not failed["ok"], failed
            assert failed["step"] in ("broadcast", "verify"), failed
            # The engine, reachable from here, aborts within seconds and
            # serves the old weights.
            t0 = time.monotonic()
            aborted = client.abort_weights_update(url, group_name=config["group_name"])
            assert time.monotonic() - t0 < 10
            assert aborted.success and not aborted.group_usable, aborted
            assert checksum(url) == before
            generate(url)
        finally:
            net.restore(hosts["t"])
    finally:
        trainer.close()
    # After the link returns, a re-initialised group syncs again.
    again = NsTrainer(hosts["t"], trainer_config(hosts["t"], [(url, 1)], tiny_model))
    try:
        assert again.call("connect") == {"ok": True}
        synced = again.call("sync", seed=8, atomic=True)
        assert synced == {"ok": True, "applied": [True]}, synced
        assert again.call("sync", seed=None, atomic=True)["ok"]
        assert checksum(url) == before
    finally:
        again.close()


def test_an_engine_host_that_disappears_mid_sync(
    net, router, engines, hosts, tiny_model
):
    """Runs last: host e2 (the TP 2 engine) is removed while the trainer
    syncs both through the router. No engine applies (atomic), the other
    keeps serving the old weights, and the router marks the lost one dead."""
    e1 = engines["e1"].url
    before = checksum(e1)
    config = trainer_config(hosts["t"], [(router, 3)], tiny_model)
    trainer = NsTrainer(hosts["t"], config)
    try:
        assert trainer.call("connect") == {"ok": True}
        trainer.send({"op": "sync", "seed": 9, "atomic": True, "hold_after_bucket": 1})
        assert trainer.next(120)["event"] == "holding"
        net.remove(hosts["e2"])
        trainer.send("go")
        failed = trainer.next(6 * TIMEOUT + 60)
        assert not failed["ok"], failed
        # torch's error names the lost peer, or the send that timed out.
        assert failed["step"] in ("broadcast", "verify"), failed
    finally:
        trainer.close()
    assert checksum(e1) == before
    generate(e1)

    def lost_one_is_dead() -> bool:
        workers = requests.get(router + "/workers", timeout=10).json()["workers"]
        return {w["url"]: w["dead"] for w in workers}[engines["e2"].url]

    wait_until(lost_one_is_dead, 60, "the router to mark the lost engine dead")

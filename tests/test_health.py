"""Healthy while updating, but not forever (patch `health-while-updating`), on the real
server: health answers at once during a blocking weight operation, watchdogs
stay quiet, overlapping and failing operations keep the state right, and a
stuck operation turns the health check unhealthy, naming it."""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass

import pytest
import requests

from harness.cpu_sglang import Server, free_port
from harness.metrics import scrape, value
from harness.trainer import GlooTrainer
from rlsync import client
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import dtype_name

pytestmark = pytest.mark.needs("health_while_updating")

pool = cf.ThreadPoolExecutor(max_workers=8)
LATE_JOIN_S = 10.0


@dataclass
class Answer:
    at: float
    status: int | None  # None: no answer within the client timeout
    seconds: float
    body: str


def health_generate(url: str, timeout: float) -> Answer:
    t0 = time.monotonic()
    try:
        resp = requests.get(url + "/health_generate", timeout=timeout)
        return Answer(t0, resp.status_code, time.monotonic() - t0, resp.text)
    except requests.Timeout:
        return Answer(t0, None, time.monotonic() - t0, "")


def poll_until(
    url: str, end: float, timeout: float, every: float = 0.5, done=None
) -> list[Answer]:
    """/health_generate every `every` seconds until `end`, or until
    done(answers) holds."""
    answers: list[Answer] = []
    while time.monotonic() < end and not (done and done(answers)):
        tick = time.monotonic()
        answers.append(health_generate(url, timeout))
        time.sleep(max(0.0, every - (time.monotonic() - tick)))
    return answers


def wait_for_log(server: Server, needle: str, timeout: float = 30.0) -> None:
    server.wait_for_log(needle, timeout)


def start_init(server: Server, port: int, group: str, timeout: float | None = None):
    """POST /init_weights_update_group in a thread; returns once the scheduler
    is inside the blocking group initialisation (seen in its log)."""
    kwargs = {"timeout": timeout} if timeout is not None else {}
    payload = dict(
        master_address="127.0.0.1",
        master_port=port,
        rank_offset=1,
        world_size=1 + server.tp,
        group_name=group,
        backend="gloo",
        **kwargs,
    )
    fut = pool.submit(
        requests.post,
        server.url + "/init_weights_update_group",
        json=payload,
        timeout=120,
    )
    wait_for_log(server, f"master_port={port}")
    return fut


def generating_health(server: Server) -> Answer:
    """A health check that takes the generation path (no update running)."""
    answer = health_generate(server.url, timeout=30)
    assert answer.status == 200 and answer.body == "", answer
    return answer


def late_trainer_scenario(server: Server, client_timeout: float):
    port = free_port()
    group = f"late_{port}"
    fut = start_init(server, port, group)
    answers = poll_until(server.url, time.monotonic() + LATE_JOIN_S, client_timeout)
    pg = join_update_group(
        "127.0.0.1", port, 1 + server.tp, group_name=group, timeout=60
    )
    resp = fut.result(timeout=60)
    return answers, pg, group, resp


@pytest.mark.needs("watchdog_pause")
@pytest.mark.parametrize("tp", [1, 2])
def test_late_trainer_health_stays_200_and_watchdog_quiet(tp, server_tp1, server_tp2):
    server = server_tp1 if tp == 1 else server_tp2
    log_start = len(server.log())
    answers, pg, group, resp = late_trainer_scenario(server, client_timeout=1.0)
    try:
        assert resp.status_code == 200 and resp.json()["success"], resp.text
        assert len(answers) >= LATE_JOIN_S / 0.5 - 2
        bad = [a for a in answers if a.status != 200 or a.seconds > 1.0]
        assert not bad, f"health not 200 within 1 s while the group initialised: {bad}"
        assert all("init_weights_update_group" in a.body for a in answers)
        assert "watchdog timeout" not in server.log()[log_start:]
        # Afterwards: generation works and an update over the group succeeds.
        out = requests.post(
            server.url + "/generate",
            json={
                "text": "abc",
                "sampling_params": {
                    "max_new_tokens": 4,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            },
            timeout=60,
        )
        assert out.status_code == 200 and len(out.json()["output_ids"]) == 4
        name = "model.norm.weight"
        current = client.get_weights_by_name(server.url, name, truncate_size=10**6)
        import torch

        tensor = torch.tensor(current, dtype=torch.bfloat16)
        # 0.5.23: upstream's single-phase update runs in its session.
        opened = client.begin_weight_update(server.url)
        upd = pool.submit(
            client.update_weights_from_distributed,
            server.url,
            names=[name],
            dtypes=[dtype_name(tensor.dtype)],
            shapes=[list(tensor.shape)],
            group_name=group,
        )
        torch.distributed.broadcast(tensor, src=0, group=pg)
        assert upd.result(timeout=60)["success"]
        if opened:
            client.end_weight_update(server.url)
        generating_health(server)
    finally:
        client.destroy_weights_update_group(server.url, group_name=group)
        leave_update_group(pg)


def test_late_trainer_fails_health_on_pristine_upstream(server_pristine):
    """The same scenario on pristine 0.5.10 (with --soft-watchdog-timeout 2):
    the health check is not answered in time, so this test proves the fix
    above."""
    server = server_pristine
    generating_health(server)  # control: idle, it answers (in about a second)
    answers, pg, group, resp = late_trainer_scenario(server, client_timeout=3.0)
    try:
        assert resp.status_code == 200
        assert answers and all(a.status != 200 for a in answers), answers
    finally:
        leave_update_group(pg)


def test_overlapping_operations_keep_health_until_the_last_ends(server_tp1):
    """Two group inits overlap: the first ends while the second still waits.
    A flag cleared by the first finisher would fail this."""
    server = server_tp1
    port_a, port_b = free_port(), free_port()
    fut_a = start_init(server, port_a, f"overlap_a_{port_a}")
    # The second is queued behind the first in the tokenizer manager.
    payload_b = dict(
        master_address="127.0.0.1",
        master_port=port_b,
        rank_offset=1,
        world_size=2,
        group_name=f"overlap_b_{port_b}",
        backend="gloo",
    )
    fut_b = pool.submit(
        requests.post,
        server.url + "/init_weights_update_group",
        json=payload_b,
        timeout=120,
    )
    first = poll_until(server.url, time.monotonic() + 2.0, timeout=1.0)
    pg_a = join_update_group("127.0.0.1", port_a, 2, group_name=f"overlap_a_{port_a}")
    assert fut_a.result(timeout=60).json()["success"]
    wait_for_log(server, f"master_port={port_b}")
    between = poll_until(server.url, time.monotonic() + 3.0, timeout=1.0)
    pg_b = join_update_group("127.0.0.1", port_b, 2, group_name=f"overlap_b_{port_b}")
    try:
        assert fut_b.result(timeout=60).json()["success"]
        for a in first + between:
            assert a.status == 200 and a.seconds <= 1.0, a
        assert all("init_weights_update_group" in a.body for a in between)
        assert any(a.body.count("init_weights_update_group") == 2 for a in first)
        generating_health(server)
    finally:
        for pg, port, tag in ((pg_a, port_a, "a"), (pg_b, port_b, "b")):
            client.destroy_weights_update_group(
                server.url, group_name=f"overlap_{tag}_{port}"
            )
            leave_update_group(pg)


def test_failing_operation_clears_the_state(server_tp1):
    server = server_tp1
    port = free_port()  # nobody listens: the trainer never comes
    t0 = time.monotonic()
    fut = start_init(server, port, f"unreachable_{port}", timeout=3)
    during = health_generate(server.url, timeout=1.0)
    resp = fut.result(timeout=60)
    elapsed = time.monotonic() - t0
    assert resp.status_code == 400 or not resp.json()["success"], resp.text
    assert elapsed < 30, f"the 3 s timeout was not honoured ({elapsed:.0f}s)"
    assert during.status == 200 and "init_weights_update_group" in during.body
    generating_health(server)


@pytest.mark.needs("init_weights_update_group_timeout")
def test_hung_operation_past_deadline_turns_unhealthy_then_recovers(
    short_deadline_server,
):
    """A weight operation stuck past the operator's deadline (its scheduler
    stopped inside it, as a hang in native code would leave it: the
    operation's own timeouts cannot end it) turns health 503, naming it;
    once it ends, health recovers."""
    server = short_deadline_server
    health = "sglang:weight_update_health_answers_total"
    before = scrape(server.url)
    port = free_port()
    fut = start_init(server, port, f"hung_{port}")
    (scheduler,) = server.schedulers()
    scheduler.suspend()

    def unhealthy_twice(answers: list[Answer]) -> bool:
        return [a.status for a in answers[-2:]] == [503, 503]

    try:
        t0 = time.monotonic()
        answers = poll_until(server.url, t0 + 60, timeout=1.0, done=unhealthy_twice)
    finally:
        scheduler.resume()
    early = [a for a in answers if a.at - t0 < 2.0]
    assert early and all(a.status == 200 for a in early), early
    first = next((i for i, a in enumerate(answers) if a.status == 503), None)
    assert first is not None, f"never unhealthy: {answers}"
    late = answers[first:]
    assert len(late) >= 2 and all(a.status == 503 for a in late), late
    assert "'init_weights_update_group' has run for" in late[-1].body
    assert "past its deadline of 3.0s" in late[-1].body
    # Resumed past its deadline, the init gives up at once (nobody joined).
    assert fut.result(timeout=60).status_code == 400
    generating_health(server)
    # /metrics counted every answer the server gave (a probe the client gave
    # up on may have been answered too).
    counted = scrape(server.url)

    def answered(answer: str) -> float:
        return value(counted, health, answer=answer) - value(
            before, health, answer=answer
        )

    assert answered("past_deadline") >= len(late)
    assert answered("healthy_while_updating") >= len(early)
    in_flight = "sglang:weight_update_operations_in_flight"
    assert value(counted, in_flight, operation="init_weights_update_group") == 0


def test_probes_that_arrive_just_before_a_blocking_init_are_answered_promptly(
    server_tp1,
):
    """A health check whose token is queued just before the init blocks the
    scheduler is answered once the init is seen, not after it ends."""
    server = server_tp1
    for round_ in range(3):
        port = free_port()
        group = f"probe_race_{port}"
        probes = []
        for i in range(6):
            probes.append(pool.submit(health_generate, server.url, 15.0))
            if i == 2:
                fut = start_init(server, port, group)
            time.sleep(0.05)  # spreads the probes around the init's start
        # The init ends only once the trainer joins, after every answer: a
        # probe held until it ends gets none within its 15 s (status None).
        answers = [p.result(timeout=30) for p in probes]
        pg = join_update_group("127.0.0.1", port, 2, group_name=group, timeout=60)
        try:
            assert fut.result(timeout=60).json()["success"]
            held = [a for a in answers if a.status != 200]
            assert not held, f"round {round_}: {held}"
        finally:
            client.destroy_weights_update_group(server.url, group_name=group)
            leave_update_group(pg)


@pytest.fixture(scope="module")
def short_deadline_server(start_module_server):
    """One server for the module's tests of the operator's deadline (3 s);
    each leaves it serving, with no group or session of its own."""
    deadline = ["--weight-update-health-deadline", "3", "--enable-metrics"]
    return start_module_server(tp=1, extra_args=deadline)


def test_a_prepared_session_whose_trainer_died_keeps_the_worker_healthy(
    short_deadline_server, model_weights
):
    """prepare, then the trainer is gone: serving goes on, so health stays
    200 past the deadline (a router would otherwise mark the worker dead),
    and the receive, which nothing will answer, ends by itself at the update
    group's timeout (the deadline, 3 s) instead of waiting for an abort."""
    server = short_deadline_server
    trainer = GlooTrainer([server.url], [1], group_name="stale_session")
    from rlsync.planner import plan_buckets

    meta = [b.meta() for b in plan_buckets(model_weights, 1 << 20)]
    client.prepare_weights_update(server.url, meta, group_name="stale_session")
    t0 = time.monotonic()
    answers = poll_until(server.url, t0 + 6.0, timeout=5.0)
    assert [a for a in answers if a.at - t0 > 4.0], "no probe past the deadline"
    assert all(a.status == 200 for a in answers), answers
    generating_health(server)
    waited = requests.post(
        server.url + "/complete_weights_update",
        json={"group_name": "stale_session", "timeout": 100},
        timeout=60,
    )
    assert waited.status_code == 400, waited.text
    message = waited.json()["message"]
    assert "nothing from the sender after 3s, the update group's timeout" in message
    assert waited.json()["open_session_group"] is None
    # The group was given up with the session: its name is free again.
    destroyed = requests.post(
        server.url + "/destroy_weights_update_group",
        json={"group_name": "stale_session"},
        timeout=30,
    )
    assert "no update group 'stale_session'" in destroyed.json()["message"]
    leave_update_group(trainer.group)


@pytest.mark.needs("init_weights_update_group_timeout")
@pytest.mark.parametrize("timeout", [120, 1e300])
def test_the_operator_deadline_bounds_an_init_with_a_longer_timeout(
    short_deadline_server, timeout
):
    """The init blocks the scheduler: asking for 120 s (or a finite but
    huge 1e300, which once held it for good) against a trainer that never
    comes, it ends at the operator's 3 s deadline and the worker serves."""
    server = short_deadline_server
    port = free_port()
    t0 = time.monotonic()
    answer = start_init(server, port, f"long_timeout_{port}", timeout=timeout)
    answer = answer.result(timeout=60)
    took = time.monotonic() - t0
    assert answer.status_code == 400, answer.text
    assert f"nothing accepted a connection at 127.0.0.1:{port}" in answer.text
    assert took < 30, f"the init answered after {took:.1f}s, not at the deadline"
    generating_health(server)


@pytest.mark.needs("init_weights_update_group_timeout")
@pytest.mark.parametrize("value", ['"5"', "true", "[5]"])
def test_an_init_timeout_is_a_number(server_tp1, value):
    body = (
        '{"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, '
        f'"world_size": 2, "group_name": "t", "backend": "gloo", "timeout": {value}}}'
    )
    resp = requests.post(
        server_tp1.url + "/init_weights_update_group",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    assert "timeout" in resp.json()["message"], resp.text


@pytest.mark.needs("init_weights_update_group_timeout")
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e309", "-1", "0"])
def test_non_finite_or_non_positive_timeouts_are_400(server_tp1, value):
    init = (
        '{"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, '
        f'"world_size": 2, "group_name": "t", "backend": "gloo", "timeout": {value}}}'
    )
    complete = f'{{"group_name": "t", "timeout": {value}}}'
    for endpoint, body in (
        ("/init_weights_update_group", init),
        ("/complete_weights_update", complete),
    ):
        resp = requests.post(
            server_tp1.url + endpoint,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert resp.status_code == 400, (endpoint, value, resp.text)
        named = "timeout: must be a finite number of seconds > 0" in resp.text
        # Later releases parse the body as strict JSON, which has no NaN or
        # Infinity and refuses 1e309 before any field is read.
        refused_as_json = value not in ("-1", "0") and "JSON decode error" in resp.text
        assert named or refused_as_json, (endpoint, value, resp.text)
    generating_health(server_tp1)

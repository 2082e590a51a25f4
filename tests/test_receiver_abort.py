"""What an abort says about the update group is what the group can do next.

The server's receive module, in this process as an engine rank (rank 1), and
a trainer (rank 0) in a process of its own, over a real gloo group: the
engine answered
"ready", so the trainer broadcasts at once; a receive that an abort ends
before every bucket arrived, even before it posted anything, may leave the
trainer's bytes on the wire, and must not call the group usable. A receive
that got every bucket is in step, and the group serves the next update."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from harness.series_modules import load_receiver_source
from rlsync.group import join_update_group, new_update_group, rendezvous_store

receiver_module = load_receiver_source()
NBYTES = 4096


def trainer_end(port: int, name: str, orders: mp.Queue, done: mp.Queue) -> None:
    """The trainer (rank 0), in its own process: broadcasts a bucket of the
    value each order names (without waiting for it where the order says so)."""
    group = join_update_group("127.0.0.1", port, 2, group_name=name, timeout=60)
    done.put("joined")
    while (order := orders.get()) is not None:
        value, wait = order
        payload = torch.full((NBYTES,), value, dtype=torch.uint8)
        work = dist.broadcast(payload, src=0, group=group, async_op=True)
        if wait:
            work.wait()
            done.put(value)
    os._exit(0)  # a broadcast nobody received may still be pending


class Trainer:
    def __init__(self, port: int, name: str):
        ctx = mp.get_context("spawn")
        self.orders, self.done = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(
            target=trainer_end, args=(port, name, self.orders, self.done), daemon=True
        )
        self.process.start()

    def send(self, value: int, wait: bool = True) -> None:
        self.orders.put((value, wait))
        if wait:
            assert self.done.get(timeout=60) == value

    def close(self) -> None:
        self.orders.put(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def bucket_specs(count: int) -> list:
    return receiver_module.parse_buckets(
        count,
        [
            {"names": [f"w{i}"], "dtypes": ["uint8"], "shapes": [[NBYTES]]}
            for i in range(count)
        ],
        "flattened_bucket",
    )


def receiver_on(group: dist.ProcessGroup, count: int, **kwargs):
    pool = receiver_module.StagingPool(torch.device("cpu"))
    return receiver_module.StagedWeightReceiver(
        bucket_specs(count), group, pool, "flattened_bucket", src=0, **kwargs
    )


def wait_until(condition, what: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def joined_group(timeout: float) -> Iterator[tuple]:
    """The trainer and this process's engine rank (1) in one gloo group,
    whose collectives time out after `timeout` seconds on the engine."""
    port, name = free_port(), f"abort_{free_port()}"
    trainer = Trainer(port, name)
    try:
        store = rendezvous_store("127.0.0.1", port, 2, 1, 60)
        engine = new_update_group(
            store, 2, 1, group_name=name, backend="gloo", timeout=timeout
        )
        assert trainer.done.get(timeout=60) == "joined"
        yield trainer, engine
    finally:
        trainer.close()


@pytest.fixture
def group():
    with joined_group(timeout=60) as both:
        yield both


def test_an_abort_before_the_first_receive_is_posted_gives_the_group_up(group):
    """The engine's rank is still preparing its sink when the trainer's
    bucket goes out and the abort comes: nothing was posted, yet the
    trainer's bytes are on the wire, so the group is not usable."""
    trainer, engine = group
    sink_ready = threading.Event()
    receiver = receiver_on(engine, 2, before_first_bucket=sink_ready.wait)
    receiver.start()
    trainer.send(7, wait=False)
    answer: list[bool] = []
    aborting = threading.Thread(target=lambda: answer.append(receiver.abort(10)))
    aborting.start()
    wait_until(receiver._abort.is_set, "the abort to reach the receiver")
    sink_ready.set()
    aborting.join(30)
    assert answer == [False], "an abort mid-update called the group usable"
    assert not receiver.pending_works, "nothing was posted"


def test_an_abort_after_every_bucket_arrived_keeps_the_group(group):
    """`sync(apply=False)` then an abort: every bucket is in, nothing is owed
    either way, the group is usable, and the next update over it lands."""
    trainer, engine = group
    receiver = receiver_on(engine, 2)
    receiver.start()
    trainer.send(1)
    trainer.send(2)
    assert receiver.wait(30) and receiver.complete, receiver.error
    assert receiver.abort(10) is True

    landed: list[torch.Tensor] = []
    following = receiver_on(
        engine, 1, sink=lambda tensors: landed.extend(t.clone() for _, t in tensors)
    )
    following.start()
    trainer.send(9)
    assert following.wait(30) and following.complete, following.error
    assert len(landed) == 1 and bool((landed[0] == 9).all())


def test_an_abort_between_buckets_gives_the_group_up(group):
    """One bucket of two arrived, then the trainer went quiet: the receive
    for the second is posted or about to be, so the group is not usable."""
    trainer, engine = group
    receiver = receiver_on(engine, 2)
    receiver.start()
    trainer.send(1)
    assert receiver.abort(10) is False


def test_a_sender_that_sends_nothing_fails_the_receive_at_the_group_timeout():
    """The trainer joined, then sends nothing (it hangs, or prepared and
    died with its store still up): the receive ends by itself at the group's
    timeout, saying so, as on NCCL (which gives up just before it: NCCL's
    watchdog would end the server), and the group is given up."""
    with joined_group(timeout=3) as (_, engine):
        receiver = receiver_on(engine, 1)
        receiver.start()
        assert receiver.wait(60), "the receive outlived the group's 3 s timeout"
        assert "nothing from the sender after" in receiver.error, receiver.error
        assert "update group's timeout" in receiver.error, receiver.error
        assert receiver.abort(10) is False


class CompletesDuringThePoll:
    """A gloo receive whose bytes land just as a poll of it times out."""

    def __init__(self):
        self.polled = False

    def wait(self, timeout=None):
        if timeout is not None and not self.polled:
            self.polled = True
            raise RuntimeError("Operation timed out!")

    def is_completed(self):
        return self.polled


def test_bytes_that_land_as_a_poll_times_out_are_a_received_bucket(group):
    """The poll's own timeout, then the receive is found complete: that is
    its bytes arriving, not the group's timeout."""
    _, engine = group
    receiver = receiver_on(engine, 1)
    work = CompletesDuringThePoll()
    receiver.pending_works.append(work)
    receiver._posted_at[id(work)] = time.monotonic()
    assert receiver._wait(work, is_cuda=False) is True
    assert not receiver.pending_works and receiver.error is None

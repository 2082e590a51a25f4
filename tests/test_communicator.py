"""The tokenizer manager's communicator to the scheduler (upstream's class;
the series fixes it on 0.5.10, 0.5.23 carries upstream's own fix): calls on
one communicator are answered one at a time in arrival order, and a caller
that arrives while the next queued one is waking does not take its turn.
On 0.5.10 it did: the woken caller failed an assert (a 500 for concurrent
/complete_weights_update calls) and the callers behind it were never woken."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.per_pin


class Sender(list):
    """What the communicator sends through: a zmq socket on 0.5.10, a
    callable on later releases; records each request."""

    def __call__(self, obj: str) -> None:
        self.append(obj)

    send_pyobj = __call__


def communicator(sender: Sender):
    try:
        from sglang.srt.managers.communicator import FanOutCommunicator
    except ImportError:  # 0.5.10: still inside the tokenizer mixin
        from sglang.srt.managers.tokenizer_communicator_mixin import (
            _Communicator as FanOutCommunicator,
        )
    return FanOutCommunicator(sender, 1)


async def a_caller_arrives_while_the_next_queued_one_wakes() -> list:
    sent = Sender()
    comm = communicator(sent)
    first = asyncio.create_task(comm.queueing_call("a"))
    await asyncio.sleep(0)
    second = asyncio.create_task(comm.queueing_call("b"))
    await asyncio.sleep(0)
    assert sent == ["a"], "the second call waits for the first's answer"
    comm.handle_recv("answer-a")
    # Arrives after the first call's answer, before the second call wakes.
    third = asyncio.create_task(comm.queueing_call("c"))
    calls = (first, second, third)
    answered = 1
    for _ in range(1000):
        await asyncio.sleep(0)
        if all(call.done() for call in calls):
            break
        if len(sent) > answered:  # the scheduler answers what it was sent
            comm.handle_recv(f"answer-{sent[answered]}")
            answered += 1
    assert all(call.done() for call in calls), f"calls left waiting; sent {sent}"
    assert sent == ["a", "b", "c"], "served in arrival order"
    return [call.result() for call in calls]


def test_a_caller_arriving_during_a_hand_off_waits_its_turn():
    from harness.cpu_sglang import build_stub_libcuda, server_env

    # Importing the tokenizer side loads the kernel library: the CPU recipe.
    env = server_env(build_stub_libcuda(), ranks=1)
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answers == [["answer-a"], ["answer-b"], ["answer-c"]]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(a_caller_arrives_while_the_next_queued_one_wakes())))

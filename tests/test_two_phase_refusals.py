"""Servers a two-phase update cannot serve are told so at prepare, before
anything reaches a scheduler: the series' tokenizer-side mixin, in the
installed patched wheel (with the environment a CPU server gets), on a
manager that has only what the mixin reads. (The expert rebalancer needs
CUDA and expert parallelism, so no CPU server runs it.)"""

from __future__ import annotations

import json

import pytest

from harness.cpu_sglang import run_server_python

pytestmark = pytest.mark.per_pin

PREPARE = """
import asyncio, json, sys
from types import SimpleNamespace
from sglang.srt.managers.io_struct import PrepareWeightsUpdateReqInput
from sglang.srt.managers.tokenizer_two_phase_update_mixin import (
    TokenizerTwoPhaseUpdateMixin,
)

reached = []


class Manager(TokenizerTwoPhaseUpdateMixin):
    def auto_create_handle_loop(self):
        pass

    def _two_phase_unsupported(self):
        return None

    async def prepare_weights_update_communicator(self, obj):
        reached.append(obj)
        return []


manager = Manager()
manager.server_args = SimpleNamespace(enable_eplb=sys.argv[1] == "on")
request = PrepareWeightsUpdateReqInput(
    group_name="g",
    num_buckets=1,
    buckets=[{"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[4]]}],
)
try:
    answer = asyncio.run(manager.prepare_weights_update(request))
    answer = {k: getattr(answer, k) for k in ("status", "status_code", "message")}
except Exception as e:  # the fake has no scheduler to answer
    answer = {"raised": type(e).__name__}
print(json.dumps({"answer": answer, "reached_schedulers": len(reached)}))
"""


def prepare(eplb: str) -> dict:
    proc = run_server_python(PREPARE, eplb)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_expert_rebalancing_is_refused_at_prepare():
    result = prepare("on")
    answer = result["answer"]
    assert answer["status"] == "error" and answer["status_code"] == 400, answer
    assert answer["message"].startswith("--enable-eplb:"), answer
    assert "nothing was done" in answer["message"]
    assert result["reached_schedulers"] == 0


def test_without_it_prepare_reaches_the_schedulers():
    assert prepare("off")["reached_schedulers"] == 1

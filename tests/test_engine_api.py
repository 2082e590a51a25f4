"""The two-phase operations on the offline sglang.Engine (patch `two-phase-weight-update`)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cpu_sglang

ROOT = Path(__file__).resolve().parents[1]


def test_engine_prepare_complete_abort(tiny_model):
    stub = cpu_sglang.build_stub_libcuda()
    env = cpu_sglang.server_env(stub, ranks=1)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "python")])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.engine_two_phase",
            str(tiny_model),
            str(cpu_sglang.free_port()),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("FINDINGS ")]
    assert lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    findings = json.loads(lines[-1].removeprefix("FINDINGS "))
    assert findings["server_info_shows_the_key"] is False
    assert findings["init"] is True
    assert findings["prepare"] == "ready"
    framed, apply, abort, digests = findings["refused_as_the_route_does"]
    assert framed.startswith("framed: "), framed
    assert apply.startswith("apply: "), apply
    assert abort.startswith("abort_header_sent: "), abort
    assert digests.startswith("digests: "), digests
    ok, message = findings["complete_of_another_session"]
    assert not ok and "engine-session-0001" in message, message
    ok, received, expected = findings["complete"]
    assert ok and received == expected > 1
    assert findings["completed_session"] == "engine-session-0001"
    assert findings["changed"] is True
    assert findings["abort_without_session"] is False
    assert findings["destroy_of_another_session"] is False
    assert findings["destroy"] is True


# Fields of the base request and the tokenizer manager's own, not a caller's.
NOT_A_CALLERS_FIELD = {"rid", "http_worker_ipc", "scheduler_wait_s"}


def installed_source(module: str) -> ast.Module:
    """The installed (patched) module's syntax tree: importing the engine
    needs the CPU recipe's environment, reading it does not."""
    package = Path(importlib.util.find_spec("sglang").origin).parent
    path = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return ast.parse(path.read_text())


def class_body(tree: ast.Module, name: str) -> list[ast.stmt]:
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found.body


def request_fields(request_class: str) -> dict[str, object]:
    """{field: its default (or EMPTY)}, in order."""
    io_struct = installed_source("sglang.srt.managers.io_struct")
    return {
        n.target.id: ast.literal_eval(n.value) if n.value else EMPTY
        for n in class_body(io_struct, request_class)
        if isinstance(n, ast.AnnAssign) and n.target.id not in NOT_A_CALLERS_FIELD
    }


def engine_parameters(method: str) -> dict[str, object]:
    """{parameter: its default (or EMPTY)} of an Engine method, self left out."""
    engine = installed_source("sglang.srt.entrypoints.engine")
    (fn,) = [
        n
        for n in class_body(engine, "Engine")
        if isinstance(n, ast.FunctionDef) and n.name == method
    ]
    names = [a.arg for a in fn.args.args[1:]]
    defaults = [ast.literal_eval(d) for d in fn.args.defaults]
    return dict(zip(names, [EMPTY] * (len(names) - len(defaults)) + defaults))


EMPTY = object()


@pytest.mark.per_pin
@pytest.mark.parametrize(
    "method, request_class",
    [
        ("prepare_weights_update", "PrepareWeightsUpdateReqInput"),
        ("complete_weights_update", "CompleteWeightsUpdateReqInput"),
        ("abort_weights_update", "AbortWeightsUpdateReqInput"),
        ("destroy_weights_update_group", "DestroyWeightsUpdateGroupReqInput"),
    ],
)
def test_an_engine_method_takes_every_field_its_route_takes(method, request_class):
    fields = request_fields(request_class)
    parameters = engine_parameters(method)
    assert [f for f in fields if f not in parameters] == []
    # Same defaults (destroy's group name stays required, as upstream has it).
    assert {
        name: (default, fields[name])
        for name, default in parameters.items()
        if default is not EMPTY and default != fields[name]
    } == {}

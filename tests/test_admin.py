"""Admin surface (patches `admin-api-key-env`, `secret-redaction`, `rlsync-info`) on the real server: every admin endpoint needs
the admin key, from the flag or from SGLANG_ADMIN_API_KEY; no answer or log
line carries a key; /rlsync_info lets a trainer check support, and rlsync's
client fails early against pristine upstream."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import requests
from conftest import (
    ACTIVE_PIN,
    KEYED_ADMIN_KEY,
    KEYED_API_KEY,
    KEYED_ENV_ADMIN_KEY,
    active_features,
    active_pin,
)

from harness import cpu_sglang
from harness.cpu_sglang import free_port
from rlsync import client, doctor
from rlsync.sender import Engine, SyncError, WeightSender

ROOT = Path(__file__).resolve().parents[1]
# The server under test: the pin's overlay, or the tree a release's smoke runs.
HTTP_SERVER = (
    Path(os.environ["RLSYNC_SGLANG_TREE"]) / "sglang/srt/entrypoints/http_server.py"
    if os.environ.get("RLSYNC_SGLANG_TREE")
    else ROOT
    / "pins"
    / ACTIVE_PIN
    / "overlay/python/sglang/srt/entrypoints/http_server.py"
)
ENV_ADMIN_KEY = "adm1n-s3cret-key"


def admin_routes() -> list[tuple[str, str, bool]]:
    """(method, path, takes a typed body) of every route marked ADMIN_OPTIONAL
    in the server."""
    lines = HTTP_SERVER.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.strip() != "@auth_level(AuthLevel.ADMIN_OPTIONAL)":
            continue
        route = lines[i - 1].strip()
        signature = " ".join(lines[i + 1 : i + 6])
        typed = "obj:" in signature.split(")")[0]
        m = re.match(r'@app\.(get|post|put)\("([^"]+)"', route)
        if m:
            found.append((m.group(1).upper(), m.group(2), typed))
            continue
        m = re.match(r'@app\.api_route\("([^"]+)", methods=\[([^\]]+)\]', route)
        if m:
            method = re.findall(r'"(\w+)"', m.group(2))[0]
            found.append((method, m.group(1), typed))
    return [r for r in found if "{" not in r[1]]


def admin_endpoints() -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in admin_routes()]


def call(url, method, path, key=None, json=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(
        method,
        url + path,
        json=json if json is not None else {},
        headers=headers,
        timeout=60,
    )


def test_the_sweep_covers_the_weight_operations():
    paths = {p for _, p in admin_endpoints()}
    for p in (
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/update_weights_from_disk",
        "/prepare_weights_update",
        "/complete_weights_update",
        "/abort_weights_update",
        "/weights_checker",
        "/pause_generation",
        "/destroy_weights_update_group",
    ):
        assert p in paths, p
    assert len(paths) > 25


@pytest.mark.needs("admin_api_key_env")
@pytest.mark.parametrize("source", ["flag", "env"])
def test_every_admin_endpoint_needs_the_admin_key(
    source, request, start_server, tiny_model
):
    """With the key from the flag (the shared keyed server: an ordinary
    --api-key too), or from the environment alone."""
    if source == "flag":
        server = request.getfixturevalue("keyed_server")
        admin_key, user_key = KEYED_ADMIN_KEY, KEYED_API_KEY
    else:
        server = start_server(env={"SGLANG_ADMIN_API_KEY": ENV_ADMIN_KEY})
        admin_key, user_key = ENV_ADMIN_KEY, "us3r-s3cret-key"
    url = server.url
    user = user_key if source == "flag" else None
    before = client.weights_checksum(url, admin_key=admin_key)["checksum"]
    version = call(url, "GET", "/model_info", user).json()["weight_version"]
    for method, path in admin_endpoints():
        for key in (None, "wrong", user_key):
            resp = call(url, method, path, key, json={"model_path": str(tiny_model)})
            assert resp.status_code == 401, (
                path,
                key,
                resp.status_code,
                resp.text[:200],
            )
    # Refused calls changed nothing.
    assert client.weights_checksum(url, admin_key=admin_key)["checksum"] == before
    assert call(url, "GET", "/model_info", user).json()["weight_version"] == version
    assert (
        requests.get(url + "/health", timeout=10).status_code == 200
    ), "health stays open"
    # The right key gets past auth on every endpoint with a typed body: a body
    # of the wrong type then fails validation (SGLang answers it as a 400),
    # and no handler runs.
    for method, path, typed in admin_routes():
        if typed:
            resp = call(url, method, path, admin_key, json=[])
            assert resp.status_code in (400, 422), (
                path,
                resp.status_code,
                resp.text[:200],
            )
            assert "validation error" in resp.text, (path, resp.text[:200])
    assert client.weights_checksum(url, admin_key=admin_key)["checksum"] == before
    # The right key works.
    for path, body in [
        ("/pause_generation", {"mode": "in_place"}),
        ("/continue_generation", {}),
        ("/flush_cache", {}),
        ("/weights_checker", {"action": "checksum"}),
    ]:
        resp = call(url, "POST", path, admin_key, json=body)
        assert resp.status_code == 200, (path, resp.text[:300])
    body = {"text": "ok", "sampling_params": {"max_new_tokens": 2}}
    gen = call(url, "POST", "/generate", user, json=body)
    assert gen.status_code == 200, gen.text


@pytest.mark.needs("secret_redaction")
def test_no_answer_or_log_line_carries_a_key(keyed_server):
    """The keyed server has all three keys (flag, environment, --api-key) and
    logs requests with SGLANG_LOG_REQUEST_HEADERS=authorization,x-rlsync-trace:
    the trace header is logged, the Authorization header never."""
    server = keyed_server
    keys = (KEYED_ADMIN_KEY, KEYED_API_KEY, KEYED_ENV_ADMIN_KEY)
    trace = f"trace-{free_port()}"
    resp = requests.post(
        server.url + "/generate",
        json={"text": "log me", "sampling_params": {"max_new_tokens": 2}},
        headers={"Authorization": f"Bearer {KEYED_API_KEY}", "X-Rlsync-Trace": trace},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    server.wait_for_log(trace, timeout=30)
    for path in ("/server_info", "/get_server_info"):
        resp = call(server.url, "GET", path, KEYED_API_KEY)
        assert resp.status_code == 200, resp.text
        assert not [k for k in keys if k in resp.text], path
        body = resp.json()
        assert body["admin_api_key"] == "<redacted>" and body["api_key"] == "<redacted>"
        assert all(
            s.get("api_key") in (None, "<redacted>") for s in body["internal_states"]
        )
        assert body["rlsync"]["series"] == active_pin().series
    log = server.log()
    # The start-up line: ServerArgs(...) on 0.5.10, a dict on 0.5.23.
    assert "server_args=ServerArgs(" in log or "server_args={" in log
    assert "admin_api_key=<redacted>" in log or "'admin_api_key': '<redacted>'" in log
    assert not [k for k in keys if k in log]


# Each way argparse takes a secret flag: in full or as an unambiguous prefix,
# its value after a space or after `=`, given twice (the first value is not
# the one parsed); `--ssl-keyfile` is another flag and keeps its value; a
# key equal to another argument (`--device cpu`) leaves that argument shown,
# or hiding it would tell the key.
SECRET_COMMAND_LINES = [
    ["--api-key", "cpu"],
    ["--api-key", "s3cret-1", "--admin-api-key=s3cret-2"],
    ["--api", "s3cret-1", "--admin-api=s3cret-2", "--ssl-keyfile-pass", "s3cret-3"],
    ["--api-k=s3cret-1", "--admin-api-key", "s3cret-2", "--ssl-keyfile", "kf.pem"],
    [
        "--api-key",
        "s3cret-1",
        "--api-key",
        "s3cret-2",
        "--ssl-keyfile-password=s3cret-3",
    ],
]
_LAUNCH_COMMANDS = """
import json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
if not hasattr(ServerArgs, "launch_command"):
    print("null")
    sys.exit()
base = ["--model-path", sys.argv[2], "--device", "cpu"]
print(json.dumps([prepare_server_args(base + a).launch_command for a in json.loads(sys.argv[1])]))
"""


@pytest.mark.needs("secret_redaction")
def test_launch_command_shows_no_secret_however_the_flag_is_spelled(tiny_model):
    """Parsed as `sglang serve` parses them (in a child process: parsing
    configures logging), on the series a server of this run starts."""
    done = cpu_sglang.run_server_python(
        _LAUNCH_COMMANDS, json.dumps(SECRET_COMMAND_LINES), str(tiny_model)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    commands = json.loads(done.stdout.splitlines()[-1])
    if commands is None:
        pytest.skip("this release records no launch_command")
    assert commands[0].endswith(" --device cpu --api-key <redacted>"), commands[0]
    for argv, command in zip(SECRET_COMMAND_LINES[1:], commands[1:]):
        assert "s3cret" not in command, (argv, command)
        assert command.count("<redacted>") == sum("s3cret" in a for a in argv)
    assert "--ssl-keyfile kf.pem" in commands[3]


@pytest.mark.needs("admin_api_key_env")
def test_flag_wins_over_the_environment(keyed_server):
    """The keyed server has an admin key in the flag and another in
    SGLANG_ADMIN_API_KEY."""
    body = {"action": "checksum"}
    url = keyed_server.url
    ok = call(url, "POST", "/weights_checker", KEYED_ADMIN_KEY, json=body)
    assert ok.status_code == 200
    bad = call(url, "POST", "/weights_checker", KEYED_ENV_ADMIN_KEY, json=body)
    assert bad.status_code == 401


def test_rlsync_info_on_the_patched_server(server_tp1):
    info = client.rlsync_info(server_tp1.url)
    pin = active_pin()
    assert info["series"] == pin.series and info["version"] == pin.local_version
    assert info["pin"] == {"name": "sglang", "version": pin.version}
    assert sorted(info["features"]) == sorted(active_features())
    assert "two_phase_weight_update" in info["features"]
    assert client.require_features(server_tp1.url, ["two_phase_weight_update"]) == info
    with pytest.raises(client.EngineError, match="without time_travel; upgrade"):
        client.require_features(server_tp1.url, ["time_travel"])


def test_the_server_reports_its_torch_behind_the_key_and_doctor_shows_it(
    server_tp1, capsys
):
    """Versions are for a trainer that may drive the server (`/server_info`),
    not for any caller (the open `/rlsync_info`)."""
    import torch

    assert "torch_version" not in client.rlsync_info(server_tp1.url)
    block = client.server_info(server_tp1.url)["rlsync"]
    assert block["torch_version"] == torch.__version__
    assert block["cuda_version"] == torch.version.cuda
    assert doctor.doctor([server_tp1.url], backend="gloo") == 0
    assert f"  torch {torch.__version__}; NCCL " in capsys.readouterr().out


@pytest.mark.release_independent
def test_client_fails_early_against_pristine_upstream(server_pristine):
    pristine = server_pristine
    with pytest.raises(client.EngineError, match="not patched with rlsync") as err:
        client.rlsync_info(pristine.url)
    assert err.value.status == 404 and pristine.url in str(err.value)
    sender = WeightSender(
        [Engine(pristine.url)], master_port=free_port(), backend="gloo"
    )
    with pytest.raises(SyncError, match="connect: .*not patched with rlsync"):
        sender.connect()

"""A hostile caller against a server with an admin key and an ordinary API
key: every admin route needs the admin key, discovery needs none, malformed
headers and fields get a 4xx naming them (never a 5xx), and impossible
sizes a 413 naming the bucket."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
import requests
from conftest import KEYED_ADMIN_KEY, KEYED_API_KEY

from harness import cpu_sglang
from harness.cpu_sglang import free_port
from rlsync import client

ROOT = Path(__file__).resolve().parents[1]
ADMIN, API = KEYED_ADMIN_KEY, KEYED_API_KEY
GOOD = {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[64]]}


@pytest.fixture
def keyed(keyed_server):
    return keyed_server


def raw_post(url: str, path: str, body: bytes, authorization: bytes) -> int:
    """POST with an Authorization header of arbitrary bytes (requests would
    refuse to send them)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.putheader("Authorization", authorization)
    conn.endheaders(body)
    status = conn.getresponse().status
    conn.close()
    return status


def admin(url: str, path: str, payload: dict | str) -> requests.Response:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return requests.post(
        url + path,
        data=data,
        headers={
            "Authorization": f"Bearer {ADMIN}",
            "Content-Type": "application/json",
        },
        timeout=60,
    )


def test_discovery_needs_no_key(keyed):
    assert requests.get(keyed.url + "/rlsync_info", timeout=10).status_code == 200
    assert "two_phase_weight_update" in client.rlsync_info(keyed.url)["features"]


@pytest.mark.needs("admin_api_key_env")  # the auth fix lives in that patch
@pytest.mark.parametrize(
    "token", ["Bearer k\u00e9y".encode("latin-1"), b"Bearer \xff\xfe", b"\xe2\x82\xac"]
)
@pytest.mark.parametrize(
    "path", ["/weights_checker", "/prepare_weights_update", "/generate"]
)
def test_a_non_ascii_bearer_token_is_401(keyed, path, token):
    assert raw_post(keyed.url, path, b"{}", token) == 401
    assert keyed.alive()


@pytest.mark.parametrize(
    "path,payload",
    [
        ("/load_lora_adapter_from_tensors", {"lora_name": "x", "tensors": {}}),
        ("/set_trace_level?level=1", {}),
    ],
)
def test_admin_level_routes_refuse_the_ordinary_key(keyed, path, payload):
    resp = requests.post(
        keyed.url + path,
        json=payload,
        headers={"Authorization": f"Bearer {API}"},
        timeout=30,
    )
    assert resp.status_code == 401, resp.text


LONE_SURROGATE = '"\\ud800"'


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/prepare_weights_update",
            '{"num_buckets": 1, "buckets": [%s], "group_name": %s}'
            % (json.dumps(GOOD), LONE_SURROGATE),
        ),
        ("/complete_weights_update", '{"group_name": %s}' % LONE_SURROGATE),
        ("/abort_weights_update", '{"group_name": %s}' % LONE_SURROGATE),
        (
            "/init_weights_update_group",
            '{"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, '
            '"world_size": 2, "group_name": %s, "backend": "gloo"}' % LONE_SURROGATE,
        ),
    ],
)
def test_a_lone_surrogate_group_name_is_400(keyed, path, body):
    resp = admin(keyed.url, path, body)
    assert resp.status_code == 400, resp.text
    assert "group_name" in resp.text


@pytest.mark.parametrize(
    "path",
    [
        "/prepare_weights_update",
        "/complete_weights_update",
        "/init_weights_update_group",
        "/update_weights_from_disk",
        "/weights_checker",
    ],
)
def test_deeply_nested_bodies_are_400(keyed, path):
    for body in (
        "[" * 5000 + "]" * 5000,
        '{"group_name": ' + "[" * 3000 + "]" * 3000 + "}",
    ):
        resp = admin(keyed.url, path, body)
        assert resp.status_code == 400, (path, resp.status_code, resp.text[:300])
        if path == "/prepare_weights_update":
            assert resp.json()["message"] == "body: nested too deeply", resp.text
    assert keyed.alive()


@pytest.mark.parametrize(
    "path,body,field",
    [
        (
            "/complete_weights_update",
            '{"group_name": "g", "weight_version": "v%s"}' % LONE_SURROGATE[1:-1],
            "weight_version",
        ),
        (
            "/update_weight_version",
            '{"new_version": %s}' % LONE_SURROGATE,
            "new_version",
        ),
        (
            "/prepare_weights_update",
            '{"num_buckets": 1, "buckets": [{"names": ["model.norm.weight", %s], '
            '"dtypes": ["bfloat16"], "shapes": [[64]]}]}' % LONE_SURROGATE,
            "buckets[0].names[1]",
        ),
        ("/weights_checker", '{%s: "checksum"}' % LONE_SURROGATE, "body (a key)"),
    ],
)
def test_a_lone_surrogate_anywhere_is_400_naming_where(keyed, path, body, field):
    """Python's json accepts lone surrogates; stored as the weight version
    one would make every later /model_info a 500."""
    resp = admin(keyed.url, path, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith(f"{field}: holds a lone UTF-16"), resp.text
    info = requests.get(
        keyed.url + "/model_info",
        headers={"Authorization": f"Bearer {API}"},
        timeout=30,
    )
    assert info.status_code == 200, info.text


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_buckets", "1"),
        ("num_buckets", True),
        ("num_buckets", 1.0),
        ("group_name", 5),
        ("load_format", 1),
    ],
)
def test_prepare_types_are_strict(keyed, field, value):
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": "g", field: value}
    resp = admin(keyed.url, "/prepare_weights_update", payload)
    assert resp.status_code == 400, resp.text
    assert field in resp.text


@pytest.mark.parametrize("field", ["load_fromat", "flush_cache", "rank_offset"])
def test_a_prepare_field_the_server_does_not_know_is_400_naming_it(keyed, field):
    """A misspelt field would otherwise be dropped and its default taken
    (the per-tensor layout for "load_fromat"): the update would then fail,
    or do other than asked, far from the typo."""
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": "g", field: 1}
    resp = admin(keyed.url, "/prepare_weights_update", payload)
    assert resp.status_code == 400, resp.text
    message = resp.json()["message"]
    assert message.startswith(f"{field}: not a field of a prepare"), message
    assert "load_format" in message and "rid" not in message.split("(")[1]


@pytest.mark.parametrize(
    "field,named", [("k" * (1 << 20), "'" + "k" * 64 + "'..."), ("", "''")]
)
def test_an_unknown_prepare_field_s_long_or_empty_name_is_quoted_cut_short(
    keyed, field, named
):
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": "g", field: 1}
    resp = admin(keyed.url, "/prepare_weights_update", payload)
    assert resp.status_code == 400, resp.text[:200]
    assert resp.json()["message"].startswith(f"{named}: not a field of a prepare")
    assert len(resp.content) < 1000


@pytest.mark.parametrize("field", ["flush_cache", "apply", "drain", "release_staging"])
def test_complete_flags_are_booleans_not_numbers(keyed, field):
    resp = admin(keyed.url, "/complete_weights_update", {"group_name": "g", field: 1})
    assert resp.status_code == 400, resp.text
    assert field in resp.text


@pytest.mark.parametrize(
    "path",
    [
        "/complete_weights_update",
        "/abort_weights_update",
        "/destroy_weights_update_group",
        "/init_weights_update_group",
        "/update_weights_from_disk",
        "/weights_checker",
    ],
)
def test_a_malformed_body_is_answered_without_the_servers_paths(keyed, path):
    """A 400 names the fields; it never says where the server's code lives
    (FastAPI appends the endpoint's source file and line to its message)."""
    payload = {"group_name": 5, "flush_cache": 1, "model_path": 7, "action": 7}
    payload.update(master_address=[], master_port="x", world_size="y")
    resp = admin(keyed.url, path, payload)
    assert resp.status_code == 400, resp.text
    assert "validation error" in resp.text, resp.text
    for leak in ('File "', "site-packages", "http_server", ".py"):
        assert leak not in resp.text, (path, resp.text)


def test_a_malformed_field_is_named_not_echoed_back_whole(keyed):
    """A 2 MB list where a string goes is a 400 naming the field that shows
    the start of the value: it never carries the body back (it did twice
    in the message, about four times the body once encoded)."""
    big = list(range(300_000))
    resp = admin(keyed.url, "/destroy_weights_update_group", {"group_name": big})
    assert resp.status_code == 400, resp.text[:500]
    assert len(resp.content) < 10_000, (len(resp.content), resp.text[:500])
    message = resp.json()["message"]
    assert "group_name" in message and "more characters)" in message, message


def group(url: str) -> str:
    """An update group with nobody on the far side: prepare never sends."""
    name = f"hostile_{free_port()}"
    port = free_port()
    import concurrent.futures as cf

    from rlsync.group import join_update_group

    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(
            client.init_weights_update_group,
            url,
            master_address="127.0.0.1",
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=name,
            backend="gloo",
            timeout=60,
            admin_key=ADMIN,
        )
        join_update_group("127.0.0.1", port, 2, group_name=name, timeout=60)
        fut.result()
    return name


@pytest.mark.parametrize(
    "shapes", [[[2**40, 2**40]], [[2**62]], [[2**200]], [[64], [2**40, 2**40]]]
)
def test_impossible_sizes_are_413_naming_the_bucket(keyed, shapes):
    """No --weight-update-staging-budget-mb: the default bound is what the
    device has free; the message names the bucket that needs the buffers."""
    name = group(keyed.url)
    buckets = [
        {
            "names": [f"model.layers.{i}.mlp.down_proj.weight"],
            "dtypes": ["bfloat16"],
            "shapes": [shape],
        }
        for i, shape in enumerate(shapes)
    ]
    resp = admin(
        keyed.url,
        "/prepare_weights_update",
        {"num_buckets": len(buckets), "buckets": buckets, "group_name": name},
    )
    assert resp.status_code == 413, resp.text
    last = len(shapes) - 1
    assert resp.json()["message"].startswith(f"buckets[{last}]: staging needs")
    assert "bytes of device memory free" in resp.json()["message"]
    client.destroy_weights_update_group(keyed.url, group_name=name, admin_key=ADMIN)


@pytest.mark.needs("admin_api_key_env")
def test_keys_with_several_tokenizer_workers_refuse_to_start(tiny_model, tmp_path):
    for extra, env in (
        (["--admin-api-key", ADMIN], None),
        ([], {"SGLANG_ADMIN_API_KEY": ADMIN}),
    ):
        with pytest.raises(RuntimeError) as err:
            cpu_sglang.launch(
                tiny_model,
                tmp_path / "workers.log",
                extra_args=["--tokenizer-worker-num", "2", *extra],
                env_overrides=env,
                ready_timeout=120,
            )
        assert "--tokenizer-worker-num > 1 cannot enforce" in str(err.value)
        assert ADMIN not in str(err.value)


@pytest.mark.needs("admin_api_key_env")
def test_a_key_from_a_config_file_without_a_value_refuses_to_start(
    tiny_model, tmp_path
):
    """`admin-api-key:` with nothing after it (a template whose variable was
    unset) made the admin key the string "None"."""
    config = tmp_path / "keys.yaml"
    config.write_text("admin-api-key:\n")
    try:
        server = cpu_sglang.launch(
            tiny_model,
            tmp_path / "config.log",
            extra_args=["--config", str(config)],
            ready_timeout=120,
        )
    except RuntimeError as err:
        assert "Config option 'admin-api-key' is a secret" in str(err)
    else:
        server.stop()
        pytest.fail("started with the admin key of a config line without a value")


_PARSE_EACH = """
import json, os, sys
from sglang.srt.server_args import prepare_server_args
answers = []
for argv, env in json.loads(sys.argv[1]):
    model = "dummy" if "--dummy" in argv else sys.argv[2]
    base = ["--model-path", model, "--device", "cpu"]
    argv = [a for a in argv if a != "--dummy"]
    os.environ.pop("SGLANG_ADMIN_API_KEY", None)
    os.environ.update(env)
    try:
        args = prepare_server_args(base + argv)
        getattr(args, "resolve_once", lambda: None)()  # where resolution is lazy
        got = args.resolved_dict() if hasattr(args, "resolved_dict") else vars(args)
        answers.append(["started", got["api_key"] == "k", got["admin_api_key"] == "k"])
    except Exception as e:
        answers.append(["refused", str(e)])
print(json.dumps(answers))
"""


@pytest.mark.needs("admin_api_key_env")
def test_a_key_that_would_be_empty_or_never_read_refuses_to_start(tiny_model, tmp_path):
    """Each was a server with no key at all (every route open), or with a
    config file whose keys were never applied. Parsed as `sglang serve`
    parses a command line (in a child process: parsing configures logging);
    the test above starts a real one."""
    config = tmp_path / "keys.yaml"
    config.write_text('api-key: "k"\nadmin-api-key: "k"\n')
    yaml_keys = {
        "null_list": "admin-api-key: [~]",  # was the key "None"
        "empty_list": "admin-api-key: []",  # was no key at all
        "hex": "admin-api-key: 0x1F",  # was the key "31"
        "bool": "admin-api: no",  # was the key "false"
    }
    for name, line in yaml_keys.items():
        (tmp_path / f"{name}.yaml").write_text(line + "\n")
    blank = "is blank, None or an unexpanded variable"
    secret = "' is a secret: give it as a non-empty quoted string"
    not_read = f"The config file '{config}' was not read: give it as"
    cases = [
        (f"--api-key {blank}", ["--api-key", ""], {}),
        (f"--admin-api-key {blank}", ["--admin-api-key=  "], {}),
        (f"--api-key {blank}", ["--api-key", "\u200b"], {}),
        (f"SGLANG_ADMIN_API_KEY {blank}", [], {"SGLANG_ADMIN_API_KEY": ""}),
        (f"SGLANG_ADMIN_API_KEY {blank}", [], {"SGLANG_ADMIN_API_KEY": "None"}),
        (f"SGLANG_ADMIN_API_KEY {blank}", [], {"SGLANG_ADMIN_API_KEY": '""'}),
        (f"--api-key {blank}", ["--api-key", "$API_KEY"], {}),
        (f"--admin-api-key {blank}", ["--admin-api-key", "${ADMIN_KEY}"], {}),
        # The dummy model path skips model checks, never the key checks.
        (f"--api-key {blank}", ["--dummy", "--api-key", ""], {}),
        (not_read, [f"--config={config}"], {}),
        (not_read, ["--conf", str(config)], {}),
        *(
            (
                f"Config option '{line.split(':')[0]}{secret}",
                ["--config", str(tmp_path / f"{name}.yaml")],
                {},
            )
            for name, line in yaml_keys.items()
        ),
    ]
    controls = [
        (["--config", str(config)], {"SGLANG_ADMIN_API_KEY": ""}),  # flag wins
        (["--api-key", "k"], {"SGLANG_ADMIN_API_KEY": "k"}),
    ]
    done = cpu_sglang.run_server_python(
        _PARSE_EACH,
        json.dumps([*((argv, env) for _, argv, env in cases), *controls]),
        str(tiny_model),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for (cause, argv, _), answer in zip(cases, answers):
        assert answer[0] == "refused" and cause in answer[1], (argv, answer)
    assert answers[len(cases) :] == [["started", True, True], ["started", True, True]]


_CHECK_EACH = """
import json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
answers = []
for case in json.loads(sys.argv[1]):
    try:
        if isinstance(case, dict):  # keyword arguments, as sglang.Engine takes
            args = ServerArgs(model_path=sys.argv[2], device="cpu", **case)
        else:
            args = prepare_server_args(["--model-path", sys.argv[2], "--device", "cpu"] + case)
        getattr(args, "resolve_once", lambda: None)()  # where resolution is lazy
        args.check_server_args()
        answers.append(["started"])
    except Exception as e:
        answers.append(["refused", f"{type(e).__name__}: {e}"])
print(json.dumps(answers))
"""


@pytest.mark.per_pin
def test_a_weight_update_flag_out_of_range_refuses_to_start(tiny_model):
    """Each was taken: a deadline of 0 made every health check during an
    update a 503, a body limit of 0 refused every weight-update request, inf
    or 1e303 ended the start-up with an OverflowError once the model had
    loaded, a deadline of 1e300 failed every update group's init. Checked as
    a server checks its arguments before it starts anything (in a child
    process); a message shows a value cut short, or only its type."""
    flags = [
        "--weight-update-health-deadline",
        "--weight-update-staging-budget-mb",
        "--weight-update-max-request-mb",
        "--weight-update-max-tensor-request-mb",
    ]
    cases = [
        (flag, [flag, value]) for flag in flags for value in ("0", "-1", "nan", "inf")
    ]
    cases += [  # too large to use: an overflow after the model loaded, or an
        # update group's init that could never start
        ("--weight-update-max-request-mb", ["--weight-update-max-request-mb", "1e303"]),
        (
            "--weight-update-health-deadline",
            ["--weight-update-health-deadline", "1e300"],
        ),
        # too small to use: no weight-update request, or no update, could pass
        (
            "--weight-update-max-request-mb",
            ["--weight-update-max-request-mb", "1e-300"],
        ),
        (
            "--weight-update-health-deadline",
            ["--weight-update-health-deadline", "1e-9"],
        ),
    ]
    cases += [  # as sglang.Engine's keywords
        ("--weight-update-staging", {"weight_update_staging": "gpu"}),
        ("--weight-update-health-deadline", {"weight_update_health_deadline": None}),
        ("--weight-update-health-deadline", {"weight_update_health_deadline": 10**400}),
        ("--weight-update-max-request-mb", {"weight_update_max_request_mb": [[[1]]]}),
    ]
    controls = [
        [],
        ["--weight-update-health-deadline", "1.5"],
        [
            "--weight-update-staging-budget-mb",
            "1024",
            "--weight-update-staging",
            "host",
        ],
    ]
    done = cpu_sglang.run_server_python(
        _CHECK_EACH,
        json.dumps([*(case for _, case in cases), *controls]),
        str(tiny_model),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for (flag, case), answer in zip(cases, answers):
        assert answer[0] == "refused", (case, answer)
        assert answer[1].startswith(f"ValueError: {flag}: expected"), (case, answer)
        assert len(answer[1]) < 250, answer
    assert answers[len(cases) :] == [["started"]] * len(controls)


def test_an_oversized_weight_update_body_is_413_before_it_is_parsed(keyed):
    """A million names (about 60 MB) is refused by its size, not after
    seconds of parsing on the event loop that serves generation too."""
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(1_000_000)]
    body = json.dumps(
        {
            "num_buckets": 1,
            "buckets": [{"names": names, "dtypes": [], "shapes": []}],
            "group_name": "g",
        }
    )
    assert len(body) > 16 * 2**20
    resp = admin(keyed.url, "/prepare_weights_update", body)
    assert resp.status_code == 413, resp.text[:200]
    assert resp.json()["message"].startswith("body: larger than the 16 MiB")
    generated = requests.post(
        keyed.url + "/generate",
        json={"text": "ok", "sampling_params": {"max_new_tokens": 2}},
        headers={"Authorization": f"Bearer {API}"},
        timeout=60,
    )
    assert generated.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/update_weights_from_tensor",
        "/update_weights_from_ipc",
        "/load_lora_adapter",
        "/load_lora_adapter_from_tensors",
    ],
)
def test_tensor_and_adapter_bodies_are_bounded_by_their_own_flag(keyed, path):
    """The keyed server runs with --weight-update-max-tensor-request-mb 1:
    a 2 MiB body is a 413 naming that flag before it is parsed; a small one
    goes on to the route (a 400 for its malformed fields, not a 413)."""
    big = json.dumps({"serialized_named_tensors": ["x" * (2 << 20)]})
    resp = admin(keyed.url, path, big)
    assert resp.status_code == 413, resp.text[:200]
    assert resp.json()["message"] == (
        "body: larger than the 1 MiB --weight-update-max-tensor-request-mb allows"
    )
    small = admin(keyed.url, path, {"serialized_named_tensors": 5, "lora_name": 5})
    assert small.status_code == 400, small.text[:200]


def test_a_large_bad_prepare_body_is_checked_off_the_event_loop(keyed):
    """About 12 MB of bucket metadata whose last name repeats the first: it is
    parsed and refused in a thread, so the event loop answers other callers
    meanwhile, and the scheduler never sees it."""
    count = 200_000
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(count)]
    names[-1] = names[0]
    body = json.dumps(
        {
            "num_buckets": 1,
            "buckets": [
                {
                    "names": names,
                    "dtypes": ["bfloat16"] * count,
                    "shapes": [[1]] * count,
                }
            ],
            "group_name": "g",
        }
    )
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(admin, keyed.url, "/prepare_weights_update", body)
        answered_meanwhile = 0
        while not pending.done():
            if requests.get(keyed.url + "/rlsync_info", timeout=30).ok:
                answered_meanwhile += pending.done() is False
        resp = pending.result()
    assert resp.status_code == 400, resp.text[:300]
    assert f"buckets[0].names[{count - 1}]: duplicate name" in resp.json()["message"]
    assert answered_meanwhile >= 3, "the event loop was held while the body was checked"

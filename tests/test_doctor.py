"""`rlsync doctor`: what the trainer and each engine run, and per engine
whether a sync can work, against local HTTP stand-ins (no SGLang server
starts here). The trainer's side is set per test, so that no result depends
on this host's GPU."""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pytest

from harness.http_stand_in import Answers, HttpStandIn
from rlsync import cli, doctor

NOBODY = "http://127.0.0.1:9"  # nothing listens
FEATURES = ["two_phase_weight_update", "rlsync_info", "session_ids"]
GPU_TRAINER = doctor.TrainerSide("2.9.1+cu128", "12.8", (2, 27, 5))
CPU_TRAINER = doctor.TrainerSide("2.9.1+cu128", None, None)


def engine_answers(
    *,
    features: Optional[list[str]] = FEATURES,
    admin_api_key: Optional[str] = None,
    api_key: Optional[str] = None,
    **reported: Any,
) -> Answers:
    """What a patched 0.5.10 server answers (`features=None`: an unpatched
    one); `reported` (torch, CUDA, NCCL versions) goes where the series puts
    them: /server_info's "rlsync" block, not the open /rlsync_info."""
    server_info: dict[str, Any] = {
        "tp_size": 1,
        "dp_size": 1,
        "version": "0.5.10",
        "admin_api_key": admin_api_key,
        "api_key": api_key,
    }
    answers: Answers = {("GET", "/server_info"): (200, server_info)}
    if features is not None:
        info = {
            "series": 7,
            "version": "0.5.10+rlsync.7",
            "pin": {"name": "sglang", "version": "0.5.10"},
            "features": features,
        }
        answers[("GET", "/rlsync_info")] = (200, info)
        server_info["rlsync"] = {**info, **reported}
    return answers


@pytest.fixture
def gpu_trainer(monkeypatch) -> None:
    monkeypatch.setattr(doctor, "trainer_side", lambda: GPU_TRAINER)


@pytest.fixture
def cpu_trainer(monkeypatch) -> None:
    monkeypatch.setattr(doctor, "trainer_side", lambda: CPU_TRAINER)


@pytest.fixture
def no_keys_in_environment(monkeypatch) -> None:
    monkeypatch.delenv("SGLANG_ADMIN_API_KEY", raising=False)
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)


@pytest.fixture
def engine() -> Iterator[HttpStandIn]:
    with HttpStandIn(engine_answers()) as stand_in:
        yield stand_in


def run_doctor(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["doctor", *argv])
    return code, capsys.readouterr().out


def test_doctor_prints_both_sides_and_passes_a_patched_engine(
    gpu_trainer, no_keys_in_environment, engine, capsys
):
    code, out = run_doctor(capsys, engine.url)
    assert code == 0, out
    assert "trainer: torch 2.9.1+cu128; CUDA 12.8; NCCL 2.27.5" in out
    assert "SGLang 0.5.10; rlsync series 7 (0.5.10+rlsync.7)" in out
    assert "features: two_phase_weight_update, rlsync_info, session_ids" in out
    assert "torch not reported; NCCL not reported" in out
    assert "ok    two-phase update" in out
    assert "=> can sync (unchecked: NCCL)" in out


def test_doctor_fails_an_unpatched_engine_and_an_unreachable_one(
    cpu_trainer, no_keys_in_environment, engine, capsys
):
    with HttpStandIn(engine_answers(features=None)) as unpatched:
        code, out = run_doctor(capsys, engine.url, unpatched.url, NOBODY)
    assert code == 1, out
    assert "no CUDA: use backend='gloo'" in out
    assert "not patched with rlsync" in out
    assert out.count("=> can sync") == 1
    assert "=> cannot sync: two-phase update" in out
    assert "=> cannot sync: reachable" in out


def test_doctor_fails_an_engine_without_the_two_phase_update(
    cpu_trainer, no_keys_in_environment, capsys
):
    with HttpStandIn(engine_answers(features=["rlsync_info"])) as old:
        code, out = run_doctor(capsys, old.url)
    assert code == 1, out
    assert "has no two_phase_weight_update" in out


@pytest.mark.parametrize(
    "engine_nccl, mark, code",
    [
        ([2, 27, 5], "ok    NCCL: trainer 2.27.5, engine 2.27.5", 0),
        ("2.30.3", "ok    NCCL: trainer 2.27.5, engine 2.30.3", 0),
        ([3, 0, 1], "FAIL  NCCL: major versions differ", 1),
    ],
)
def test_doctor_with_nccl_compares_the_major_versions(
    gpu_trainer, no_keys_in_environment, capsys, engine_nccl, mark, code
):
    with HttpStandIn(engine_answers(nccl_version=engine_nccl)) as stand_in:
        exit_code, out = run_doctor(capsys, stand_in.url, "--backend", "nccl")
    assert exit_code == code, out
    assert mark in out


def test_doctor_with_gloo_matches_no_nccl_version(
    gpu_trainer, no_keys_in_environment, capsys
):
    with HttpStandIn(engine_answers(nccl_version=[3, 0, 1])) as stand_in:
        code, out = run_doctor(capsys, "--backend", "gloo", stand_in.url)
    assert code == 0, out
    assert "ok    NCCL: backend='gloo': no NCCL version to match" in out


def test_doctor_with_nccl_on_a_trainer_without_cuda_says_use_gloo(
    cpu_trainer, no_keys_in_environment, engine, capsys
):
    code, out = run_doctor(capsys, engine.url, "--backend", "nccl")
    assert code == 1, out
    assert "FAIL  backend='nccl'" in out and "use backend='gloo'" in out
    assert "=> cannot sync: backend='nccl'" in out


def test_doctor_fails_an_engine_whose_admin_key_was_not_given(
    cpu_trainer, no_keys_in_environment, capsys
):
    with HttpStandIn(engine_answers(admin_api_key="<redacted>")) as stand_in:
        code, out = run_doctor(capsys, stand_in.url)
    assert code == 1, out
    assert "FAIL  keys: the engine has an admin key" in out
    assert "give --admin-key or set $SGLANG_ADMIN_API_KEY" in out


def test_doctor_reads_the_admin_key_from_the_environment(
    cpu_trainer, monkeypatch, capsys
):
    monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "admin")
    with HttpStandIn(engine_answers(admin_api_key="<redacted>")) as stand_in:
        code, out = run_doctor(capsys, stand_in.url)
    assert code == 0, out
    assert "ok    keys: the engine expects its admin key on admin routes" in out


def test_doctor_sends_the_api_key_and_names_it_on_a_401(
    cpu_trainer, no_keys_in_environment, capsys
):
    answers = engine_answers(api_key="<redacted>")
    with HttpStandIn(answers, key="k") as stand_in:
        code, out = run_doctor(capsys, stand_in.url)
        assert code == 1, out
        assert "FAIL  keys:" in out and "HTTP 401" in out
        assert "/server_info is an ordinary route" in out
        code, out = run_doctor(capsys, "--api-key", "k", stand_in.url)
        assert code == 0, out
        assert ("GET", "/server_info", "Bearer k") in stand_in.requests


def test_doctor_fails_an_admin_key_sent_where_the_engine_takes_its_api_key(
    cpu_trainer, no_keys_in_environment, capsys
):
    answers = engine_answers(api_key="<redacted>")
    with HttpStandIn(answers, key="k") as stand_in:
        code, out = run_doctor(
            capsys, stand_in.url, "--api-key", "k", "--admin-key", "other"
        )
    assert code == 1, out
    assert "the engine has no admin key, so its admin routes take its --api-key" in out


@pytest.mark.parametrize(
    "reported, version",
    [
        ((2, 27, 5), (2, 27, 5)),
        ([2, 30, 3], (2, 30, 3)),
        (22703, (2, 27, 3)),
        (2708, (2, 7, 8)),
        ("2.21.5+cuda12.4", (2, 21, 5)),
        ("unknown", None),
        (None, None),
    ],
)
def test_nccl_version_reads_tuples_codes_and_strings(reported, version):
    assert doctor.nccl_version(reported) == version


@pytest.mark.parametrize(
    "engine_nccl",
    ["2.²", "9" * 5000, [None], [{}], ["2", "x"], [float("nan")], [1e400], True, []],
)
def test_doctor_reads_a_malformed_nccl_version_as_not_reported(
    gpu_trainer, no_keys_in_environment, capsys, engine_nccl
):
    """An engine's answer may hold anything: never a traceback."""
    with HttpStandIn(engine_answers(nccl_version=engine_nccl)) as stand_in:
        code, out = run_doctor(capsys, stand_in.url, "--backend", "nccl")
    assert code == 0, out
    assert "?     NCCL: the engine does not report its NCCL" in out


@pytest.mark.parametrize("features", [[1, 2], 5, None, "two_phase_weight_update"])
def test_doctor_fails_an_engine_whose_features_are_not_a_list_of_names(
    cpu_trainer, no_keys_in_environment, capsys, features
):
    answers = engine_answers()
    answers[("GET", "/rlsync_info")][1]["features"] = features
    with HttpStandIn(answers) as stand_in:
        code, out = run_doctor(capsys, stand_in.url)
    assert code == 1, out
    assert "FAIL  two-phase update: its /rlsync_info lists no features" in out

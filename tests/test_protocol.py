"""Typed protocol messages (the two-phase wire types) and the sender's helpers."""

from __future__ import annotations

import pytest
import torch

from rlsync.protocol import (
    BucketMetadata,
    CompleteWeightsUpdateRequest,
    CompleteWeightsUpdateResponse,
    PrepareWeightsUpdateRequest,
    PrepareWeightsUpdateResponse,
    ProtocolError,
    RankResult,
)
from rlsync.sender import named_tensors, progress_bar


def test_prepare_request_has_seed_000s_fields():
    req = PrepareWeightsUpdateRequest(
        num_buckets=1,
        buckets=[BucketMetadata(["a"], ["bfloat16"], [[2, 3]])],
        group_name="g",
    )
    assert req.to_json() == {
        "num_buckets": 1,
        "buckets": [{"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[2, 3]]}],
        "group_name": "g",
        "load_format": None,
    }


def test_bucket_metadata_rejects_unequal_lengths():
    with pytest.raises(ValueError, match="lengths differ: 2/1/1"):
        BucketMetadata(["a", "b"], ["bfloat16"], [[1]])


def test_complete_request_drops_unset_optionals():
    # flush_cache left to the server (it flushes when nothing is in flight).
    assert CompleteWeightsUpdateRequest("g").to_json() == {
        "group_name": "g",
        "apply": True,
        "release_staging": False,
    }


def test_answers_parse_keep_extras_and_name_missing_fields():
    out = CompleteWeightsUpdateResponse.from_json(
        {
            "success": True,
            "num_buckets_received": 3,
            "message": "",
            "rank_results": [{"rank": 0, "success": True, "message": ""}],
            "new": 1,
        }
    )
    assert out.rank_results == [RankResult(0, True, "")] and out.extra == {"new": 1}
    with pytest.raises(ProtocolError, match="missing status"):
        PrepareWeightsUpdateResponse.from_json({"message": "x"})
    with pytest.raises(ProtocolError, match="expected a JSON object"):
        CompleteWeightsUpdateResponse.from_json(["success"])
    with pytest.raises(ProtocolError, match="rank_results: malformed"):
        CompleteWeightsUpdateResponse.from_json({"success": True, "rank_results": [{}]})


def test_named_tensors_references_never_copies():
    t = torch.ones(3)
    module = torch.nn.Linear(2, 2)
    assert [n for n, _ in named_tensors(module)] == ["weight", "bias"]
    assert next(iter(named_tensors(module)))[1] is module.weight
    assert list(named_tensors({"x": t}))[0][1] is t
    assert list(named_tensors([("x", t)]))[0][1] is t


def test_progress_bar_without_tqdm_prints_a_line_per_bucket(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name == "tqdm":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    report = progress_bar("sync")
    report(1, 2, 1_000_000)
    report(2, 2, 2_000_000)
    assert capsys.readouterr().err.splitlines() == [
        "sync: bucket 1/2, 1.0 MB",
        "sync: bucket 2/2, 2.0 MB",
    ]


def test_client_keeps_one_http_client_per_process(monkeypatch):
    from rlsync import client

    first = client.http_client()
    assert client.http_client() is first  # built once: it costs ~17 ms
    monkeypatch.setattr(client.os, "getpid", lambda: -1)  # as in a forked child
    assert client.http_client() is not first


def test_upstreams_checksum_answer_reads_as_the_series_answer():
    """SGLang 0.5.23's own checksum action answers in another shape; the
    client gives callers the series' shape, ranks in order."""
    from rlsync.client import _upstream_checksum

    def rank(tp_rank: int, overall: str) -> dict:
        return {
            "checksums": {"lm_head.weight": "00ff", "embed.weight": "0a0b"},
            "per_gpu_checksum": overall,
            "parallelism_info": [{"role": "target", "tp_rank": tp_rank, "dp_rank": 0}],
        }

    body = {
        "success": True,
        "message": "",
        "ranks": [rank(1, "bb"), rank(0, "aa")],
        "per_engine_checksum": "cc",
    }
    out = _upstream_checksum(body)
    assert out["checksum"] == "sha256:cc" and out["source"] == "upstream"
    assert [(r["rank"], r["checksum"]) for r in out["rank_results"]] == [
        (0, "sha256:aa"),
        (1, "sha256:bb"),
    ]
    assert out["num_tensors"] == 4
    assert all(r["success"] for r in out["rank_results"])


def test_upstreams_first_checksum_answer_gets_its_checksums_derived():
    """SGLang 0.5.12's checksum action answers per-tensor checksums alone
    (no per-rank or per-engine checksum): the client derives both, so two
    servers compare by one string, and any tensor that differs changes it."""
    from rlsync.client import _upstream_checksum

    def body(head: str, order: list[int]) -> dict:
        tensors = {"lm_head.weight": head, "embed.weight": "0a0b"}
        ranks = [
            {"checksums": tensors, "parallelism_info": {"tp_rank": tp, "dp_rank": 0}}
            for tp in order
        ]
        return {"success": True, "message": "Success.", "ranks": ranks}

    same = _upstream_checksum(body("00ff", [0, 1]))
    assert same["checksum"].startswith("sha256:") and same["source"] == "upstream"
    assert _upstream_checksum(body("00ff", [1, 0]))["checksum"] == same["checksum"]
    assert _upstream_checksum(body("00fe", [0, 1]))["checksum"] != same["checksum"]
    assert [r["rank"] for r in same["rank_results"]] == [0, 1]
    assert all(r["checksum"].startswith("sha256:") for r in same["rank_results"])
    assert same["num_tensors"] == 4

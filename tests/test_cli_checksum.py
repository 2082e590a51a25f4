"""`rlsync checksum URL...` (README Deploy, step 5): every engine's weights
checksum, and a verdict on whether they agree, against engines that answer
as the series' and as upstream's checksum action do."""

from __future__ import annotations

from typing import Any

import pytest

from harness.http_stand_in import HttpStandIn
from rlsync import cli

CHECKER = ("POST", "/weights_checker")


def series_answer(checksum: str, ranks: int = 1) -> dict[str, Any]:
    rank_results = [
        {"rank": r, "success": True, "checksum": f"sha256:{r}{checksum}"}
        for r in range(ranks)
    ]
    return {
        "success": True,
        "message": "Success.",
        "checksum": f"sha256:{checksum}",
        "num_tensors": 3 * ranks,
        "rank_results": rank_results,
    }


def upstream_first_answer(head: str) -> dict[str, Any]:
    """0.5.12's own action: per-tensor hashes alone."""
    tensors = {"lm_head.weight": head, "embed.weight": "0a0b"}
    info = {"tp_rank": 0, "dp_rank": 0}
    return {
        "success": True,
        "message": "",
        "ranks": [{"checksums": tensors, "parallelism_info": info}],
    }


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    code = cli.main(["checksum", *args])
    return code, capsys.readouterr().out


def test_engines_with_the_same_weights_pass(capsys):
    with HttpStandIn({CHECKER: (200, series_answer("aa"))}) as a, HttpStandIn(
        {CHECKER: (200, series_answer("aa"))}
    ) as b:
        code, out = run(capsys, a.url, b.url)
    assert code == 0, out
    assert f"{a.url}  sha256:aa  (3 tensors, 1 rank)" in out
    assert "same: all 2 engines report the same checksum" in out


def test_engines_with_other_weights_fail_saying_they_differ(capsys):
    with HttpStandIn({CHECKER: (200, series_answer("aa"))}) as a, HttpStandIn(
        {CHECKER: (200, series_answer("ab"))}
    ) as b:
        code, out = run(capsys, a.url, b.url)
    assert code == 1
    assert "DIFFER" in out and "same:" not in out


def test_engines_of_other_tp_sizes_are_not_compared(capsys):
    with HttpStandIn({CHECKER: (200, series_answer("aa", ranks=1))}) as a, HttpStandIn(
        {CHECKER: (200, series_answer("aa", ranks=2))}
    ) as b:
        code, out = run(capsys, a.url, b.url)
    assert code == 1
    assert "not comparable: the engines have different TP sizes" in out


def test_an_engine_that_refuses_the_key_fails_naming_it(capsys):
    with HttpStandIn({CHECKER: (200, series_answer("aa"))}, key="k") as a:
        code, out = run(capsys, a.url, "--admin-key", "wrong")
    assert code == 1
    assert f"{a.url}  FAILED:" in out and "401" in out


def test_upstreams_own_checksum_answers_compare_too(capsys):
    with HttpStandIn({CHECKER: (200, upstream_first_answer("00ff"))}) as a, HttpStandIn(
        {CHECKER: (200, upstream_first_answer("00ff"))}
    ) as b, HttpStandIn({CHECKER: (200, upstream_first_answer("00fe"))}) as c:
        same, out_same = run(capsys, a.url, b.url)
        differ, out_differ = run(capsys, a.url, c.url)
    assert same == 0 and "same: all 2 engines" in out_same
    assert differ == 1 and "DIFFER" in out_differ

"""/release_memory_occupation and /resume_memory_occupation (the colocated RL
loop's step) refuse what upstream's scheduler could not survive: a release
while a request runs, a resume of what is not released, an unknown tag, a
second release. Each is a 400 that says why, nothing changes, and the server
keeps serving (patch memory-release-and-resume-answer-refusals)."""

from __future__ import annotations

import json

import pytest
import requests


def post(url: str, endpoint: str, payload: dict) -> requests.Response:
    return requests.post(url + endpoint, json=payload, timeout=60)


def refusal(resp: requests.Response) -> str:
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]["message"]


def serves(url: str) -> bool:
    resp = post(
        url,
        "/generate",
        {
            "text": "still serving",
            # Four tokens whatever the weights an earlier test left: a random
            # model samples its end of sequence early now and then.
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
        },
    )
    return resp.status_code == 200 and len(resp.json()["output_ids"]) == 4


def test_a_release_while_a_request_is_paused_in_place_is_refused(server_tp1):
    """A request the RL loop paused in place still holds the KV cache and
    the weights it runs on; upstream's assert ended the server here."""
    url = server_tp1.url
    body = {
        "text": "count",
        "stream": True,
        "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True},
    }
    with requests.post(url + "/generate", json=body, stream=True, timeout=300) as run:
        lines = run.iter_lines()
        assert next(line for line in lines if line.startswith(b"data:"))
        paused = post(url, "/pause_generation", {"mode": "in_place"})
        assert paused.status_code == 200, paused.text
        try:
            message = refusal(
                post(url, "/release_memory_occupation", {"tags": ["weights"]})
            )
        finally:
            resumed = post(url, "/continue_generation", {})
        assert resumed.status_code == 200, resumed.text
        assert message.startswith("the server is not idle"), message
        assert "nothing was released" in message
        chunks = [line for line in lines if line.startswith(b"data:")]
    assert chunks[-1] == b"data: [DONE]"
    last = json.loads(chunks[-2].removeprefix(b"data:"))
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["completion_tokens"] == 1500
    assert serves(url)


@pytest.mark.parametrize(
    "endpoint,tags,said",
    [
        ("/resume_memory_occupation", ["weights"], "tags: weights not released"),
        ("/resume_memory_occupation", None, "not released (released: none)"),
        ("/release_memory_occupation", ["weight"], "tags: unknown 'weight'"),
        ("/resume_memory_occupation", ["gpu"], "tags: unknown 'gpu'"),
        ("/resume_memory_occupation", ["kv_cache"] * 2, "kv_cache given more than"),
        ("/release_memory_occupation", ["x"] * 9, "'x' and 1 more (known: "),
    ],
)
def test_what_cannot_be_released_or_resumed_is_400_and_the_server_serves(
    server_tp1, endpoint, tags, said
):
    url = server_tp1.url
    message = refusal(post(url, endpoint, {"tags": tags}))
    assert said in message, message
    assert message.endswith(
        "nothing was released" if "release_" in endpoint else "nothing was resumed"
    )
    assert serves(url)


def test_a_second_release_and_a_resume_of_more_than_was_released_are_refused(
    server_tp1,
):
    url = server_tp1.url
    released = post(url, "/release_memory_occupation", {"tags": ["kv_cache"]})
    assert released.status_code == 200, released.text
    try:
        again = refusal(post(url, "/release_memory_occupation", {"tags": ["kv_cache"]}))
        assert again.startswith("tags: kv_cache released already"), again
        every = refusal(post(url, "/resume_memory_occupation", {}))
        assert "not released (released: kv_cache)" in every, every
        twice = {"tags": ["kv_cache", "kv_cache"]}
        twice_said = refusal(post(url, "/resume_memory_occupation", twice))
        assert twice_said.startswith("tags: kv_cache given more than once")
    finally:
        resumed = post(url, "/resume_memory_occupation", {"tags": ["kv_cache"]})
    assert resumed.status_code == 200, resumed.text
    assert serves(url)

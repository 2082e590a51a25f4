"""Drive the two-phase update through the offline `sglang.Engine` API.

Run as a script (a fresh process with the CPU server environment): starts an
Engine on the given model, joins its update group from a thread as the
trainer, pushes new weights with prepare/complete (a named session whose digests
follow the bytes), checks generation changes, aborts an ended session,
destroys the group naming its session, and prints one JSON line of findings.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys

import torch
import torch.distributed as dist


# Set on the engine: its server info must never show it.
ENGINE_API_KEY = "engine-api-s3cret"


def refusal(call, *args, **kwargs) -> str:
    """The ValueError a call raises, or what it answered instead."""
    try:
        return f"answered {call(*args, **kwargs)}"
    except ValueError as e:
        return str(e)


def main(model_path: str, port: int) -> None:
    from safetensors.torch import load_file

    import sglang
    from rlsync.digest import digest_tensors
    from rlsync.group import join_update_group
    from rlsync.planner import plan_buckets

    engine = sglang.Engine(
        model_path=model_path,
        device="cpu",
        attention_backend="torch_native",
        disable_cuda_graph=True,
        mem_fraction_static=0.05,
        max_total_tokens=4096,
        skip_server_warmup=True,
        log_level="error",
        api_key=ENGINE_API_KEY,
    )
    findings = {}
    try:
        info = json.dumps(engine.get_server_info(), default=str)
        findings["server_info_shows_the_key"] = ENGINE_API_KEY in info
        params = {"max_new_tokens": 8, "temperature": 0}
        before = engine.generate("Engine", params)["output_ids"]
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(
                engine.init_weights_update_group,
                "127.0.0.1",
                port,
                1,
                2,
                "engine",
                "gloo",
            )
            pg = join_update_group("127.0.0.1", port, 2, group_name="engine")
            findings["init"] = fut.result()[0]
        weights = list(load_file(f"{model_path}/model.safetensors").items())
        gen = torch.Generator().manual_seed(0)
        new = [
            (n, (torch.randn(t.shape, generator=gen) * 0.05).to(t.dtype))
            for n, t in weights
        ]
        buckets = plan_buckets(new, 64 << 10)
        meta = [b.meta() for b in buckets]
        # A value its route refuses is refused here too, nothing opened.
        findings["refused_as_the_route_does"] = [
            refusal(engine.prepare_weights_update, len(meta), meta, framed="false"),
            refusal(engine.complete_weights_update, "engine", apply="false"),
            refusal(engine.abort_weights_update, "engine", abort_header_sent="no"),
            refusal(engine.complete_weights_update, "engine", digests="psum61:0"),
        ]
        # The newer fields: a named session whose digests follow the bytes.
        findings["prepare"] = engine.prepare_weights_update(
            len(meta),
            meta,
            group_name="engine",
            load_format="flattened_bucket",
            session_id="engine-session-0001",
            defer_digests=True,
        )["status"]
        for b in buckets:
            dist.broadcast(
                torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors]),
                0,
                group=pg,
            )
        other = engine.complete_weights_update(
            group_name="engine", session_id="engine-session-other"
        )
        findings["complete_of_another_session"] = [other["success"], other["message"]]
        done = engine.complete_weights_update(
            group_name="engine",
            weight_version="e1",
            session_id="engine-session-0001",
            digests=[digest_tensors(b.tensors) for b in buckets],
            drain=True,
            release_staging=True,
        )
        findings["complete"] = [
            done["success"],
            done["num_buckets_received"],
            len(buckets),
        ]
        findings["completed_session"] = done["session_id"]
        findings["changed"] = engine.generate("Engine", params)["output_ids"] != before
        findings["abort_without_session"] = engine.abort_weights_update(
            "engine", session_id="engine-session-0001", abort_header_sent=False
        )["success"]
        findings["destroy_of_another_session"] = engine.destroy_weights_update_group(
            "engine", session_id="engine-session-other"
        )[0]
        findings["destroy"] = engine.destroy_weights_update_group(
            "engine", session_id="engine-session-0001"
        )[0]
    finally:
        engine.shutdown()
    print("FINDINGS " + json.dumps(findings), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""A trainer on a host of its own, for the tests across hosts: run it in the
trainer's namespace (`ip netns exec NS python -m harness.ns_trainer CONFIG`).
It drives `rlsync.WeightSender` as a trainer would and takes one JSON
command per line on stdin, answering one JSON line on stdout:

    {"op": "connect"}
    {"op": "sync", "seed": 3, "atomic": true, "hold_after_bucket": 2}
        (with hold_after_bucket it says {"event": "holding"} after that
        bucket is on the wire and waits for a line "go" on stdin)
    {"op": "close"}

Each answer is {"ok": true, ...} or {"ok": false, "step": ..., "error": ...}.
CONFIG (JSON): engines [{url, tp_size, dp_size?}], master_address,
master_port, group_name, timeout, model (the checkpoint directory),
bucket_bytes, backend.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from safetensors.torch import load_file

from harness.weights import randomized
from rlsync.sender import Engine, SyncError, WeightSender


def say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main(config: dict[str, Any]) -> None:
    original = list(load_file(f"{config['model']}/model.safetensors").items())
    sender = WeightSender(
        [Engine(**e) for e in config["engines"]],
        master_address=config["master_address"],
        master_port=config["master_port"],
        group_name=config["group_name"],
        backend=config.get("backend", "gloo"),
        bucket_bytes=config.get("bucket_bytes", 64 << 10),
        timeout=config["timeout"],
    )
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "connect":
                sender.connect()
                say({"ok": True})
            elif op == "sync":
                seed: Optional[int] = command.get("seed")
                weights = original if seed is None else randomized(original, seed)
                result = sender.sync(
                    weights,
                    weight_version=command.get("weight_version"),
                    atomic=command.get("atomic", True),
                    progress=_holder(command.get("hold_after_bucket")),
                )
                say({"ok": True, "applied": [o.applied for o in result.engines]})
            elif op == "close":
                sender.close()
                say({"ok": True})
                return
        except SyncError as e:
            say({"ok": False, "step": e.step, "error": str(e)})
        except Exception as e:  # reported, so the test sees it
            say({"ok": False, "step": op, "error": f"{type(e).__name__}: {e}"})


def _holder(after: Optional[int]):
    if after is None:
        return None

    def progress(sent: int, total: int, nbytes: int) -> None:
        if sent == after:
            say({"event": "holding", "sent": sent, "total": total})
            sys.stdin.readline()

    return progress


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""The apply against a batch still running on another stream (no SGLang).

SGLang's overlapping scheduler launches batch N on its forward stream and
then takes requests while the GPU still runs it, so a complete's apply is
issued while a forward reads the live weights. This measures, on one GPU,
what that forward reads:

  baseline   the copies the apply made before it waited: shadow into live
             with `copy_(non_blocking=True)` on the scheduler's stream, then
             that stream synchronized
  apply      `ShadowParameters.apply()` (common/python/sglang/srt/
             weight_sync/shadow_params.py, loaded by file path)

A "forward" is --steps matmuls on its own stream, each reading every layer's
weight, launched just before the apply. The old weights are all zeros and
the new ones all ones, so each step's output says which it read: 0 (old),
the new value, or something in between (a layer read mid-copy). A forward
that saw the update land is the race; a forward that read only the old
weights is what an atomic update promises. Also timed: how long the apply
keeps the scheduler (the wait for the running batch included), against the
forward's own time.

    python3 bench/gpu_apply_vs_running_batch.py --out /tmp/apply-race.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
SHADOW_PARAMS = ROOT / "common/python/sglang/srt/weight_sync/shadow_params.py"


def load_shadow_params(path: Path):
    spec = importlib.util.spec_from_file_location("shadow_params", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["shadow_params"] = module
    spec.loader.exec_module(module)
    return module


class Model(torch.nn.Module):
    def __init__(self, layers: int, dim: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(dim, dim, bias=False, device="cuda", dtype=torch.float16)
            for _ in range(layers)
        )
        for layer in self.layers:
            torch.nn.init.zeros_(layer.weight)

    def load_weights(self, weights) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


def launch_forward(model: Model, x: torch.Tensor, steps: int, stream) -> List:
    """Each step reads every layer; returns one output per step (on device)."""
    outs = []
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(steps):
            acc = torch.zeros_like(x)
            for layer in model.layers:
                acc += x @ layer.weight.t()
            outs.append(acc[0, 0])
    return outs


def one_trial(shadow, model, x, steps, stream, wait: bool) -> Dict:
    # Stage the new weights (ones), as the receiver would, before the batch.
    with torch.no_grad():
        for layer in model.layers:
            layer.weight.zero_()
    shadow.begin()
    shadow.load(
        (f"layers.{i}.weight", torch.ones_like(layer.weight))
        for i, layer in enumerate(model.layers)
    )
    torch.cuda.synchronize()
    stream.wait_stream(torch.cuda.current_stream())
    outs = launch_forward(model, x, steps, stream)
    t0 = time.perf_counter()
    if wait:
        shadow.apply()
    else:
        with torch.no_grad():
            for live, staged in shadow._pairs():
                live.data.copy_(staged, non_blocking=True)
        torch.cuda.current_stream().synchronize()
    apply_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    values = [float(o) for o in outs]
    new_value = float(len(model.layers))  # x's rows sum to 1 per layer
    return dict(
        apply_s=apply_s,
        steps_reading_old=sum(v == 0 for v in values),
        steps_reading_new=sum(v == new_value for v in values),
        steps_reading_a_mix=sum(0 < v < new_value for v in values),
        live_is_new=all(bool((l.weight == 1).all()) for l in model.layers),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--shadow-params", default=str(SHADOW_PARAMS))
    args = parser.parse_args()

    module = load_shadow_params(Path(args.shadow_params))
    model = Model(args.layers, args.dim)
    shadow = module.ShadowParameters([model])
    x = torch.ones(args.rows, args.dim, device="cuda", dtype=torch.float16) / args.dim
    stream = torch.cuda.Stream()

    # The forward alone, for scale.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    launch_forward(model, x, args.steps, stream)
    torch.cuda.synchronize()
    forward_s = time.perf_counter() - t0

    result: Dict = dict(
        machine=dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            cuda=torch.version.cuda,
        ),
        config=vars(args) | {"forward_s": forward_s},
        trials={},
    )
    for name, wait in (("baseline_no_wait", False), ("apply", True)):
        one_trial(shadow, model, x, args.steps, stream, wait)  # warm-up
        result["trials"][name] = [
            one_trial(shadow, model, x, args.steps, stream, wait)
            for _ in range(args.trials)
        ]
    summary = {
        name: dict(
            forwards_that_saw_the_update_land=sum(
                t["steps_reading_old"] < args.steps for t in trials
            ),
            trials=len(trials),
            steps_reading_new_or_a_mix=sum(
                t["steps_reading_new"] + t["steps_reading_a_mix"] for t in trials
            ),
            mean_apply_s=sum(t["apply_s"] for t in trials) / len(trials),
            live_is_new_after=all(t["live_is_new"] for t in trials),
        )
        for name, trials in result["trials"].items()
    }
    result["summary"] = summary
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(dict(forward_s=forward_s, summary=summary), indent=1))


if __name__ == "__main__":
    main()

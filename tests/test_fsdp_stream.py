"""rlsync.stream with FSDP2: `fsdp_full_tensors` gathers a `fully_shard`
model one parameter at a time on every trainer rank (two gloo processes on
the CPU), rank 0 gets the unsharded model's tensors bit for bit, and
`specs_of` gives the global shapes without gathering anything."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from rlsync.planner import TensorSpec
from rlsync.stream import TensorStream, drive_gathers, fsdp_full_tensors, specs_of

SEED = 1234
DEADLINE = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tiny(torch.nn.Module):
    """An embedding and three linear layers; some parameters do not split
    evenly over two ranks (5 rows), one has a single row (rank 1's shard is
    empty)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(8, 12), torch.nn.Linear(12, 5), torch.nn.Linear(5, 1)]
        )


def make_model() -> Tiny:
    torch.manual_seed(SEED)
    return Tiny()


class GatherForbidden(RuntimeError):
    pass


def trainer_rank(rank: int, port: int, out: str) -> None:
    """One trainer rank: shard, read the specs (no gather allowed), then
    iterate the gathers; rank 0 saves what it got."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    mesh = init_device_mesh("cpu", (2,))
    model = make_model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local_shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}

    gathers = []
    real_full_tensor = DTensor.full_tensor

    def forbidden(*args, **kwargs):
        raise GatherForbidden("specs_of gathered")

    def counted(self, *args, **kwargs):
        gathers.append(1)
        return real_full_tensor(self, *args, **kwargs)

    saved = (DTensor.full_tensor, dist.all_gather_into_tensor, dist.all_gather)
    DTensor.full_tensor = forbidden
    dist.all_gather_into_tensor = dist.all_gather = forbidden
    try:
        specs = specs_of(model)
    finally:
        DTensor.full_tensor, dist.all_gather_into_tensor, dist.all_gather = saved

    DTensor.full_tensor = counted
    if rank == 0:
        got, gathered_before = {}, []
        stream = TensorStream(specs, fsdp_full_tensors(model))
        for spec in specs:  # pulled as a sender pulls them, checked
            tensor = stream.pull()
            gathered_before.append(len(gathers))
            got[spec.name] = tensor.clone()
        stream.finish()
        result = {"tensors": got, "gathered_before": gathered_before}
    else:
        result = {"count": drive_gathers(fsdp_full_tensors(model))}
    dist.barrier()
    result.update(specs=specs, local_shapes=local_shapes, gathers=len(gathers))
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_fsdp_full_tensors_gather_the_unsharded_model(tmp_path):
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=trainer_rank, args=(rank, port, str(tmp_path)))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(DEADLINE)
        assert [p.exitcode for p in procs] == [0, 0], "a trainer rank failed"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(DEADLINE)
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=False)

    reference = dict(make_model().named_parameters())
    names = list(reference)
    assert list(rank0["tensors"]) == names
    for name, tensor in rank0["tensors"].items():
        expected = reference[name].detach()
        assert tensor.dtype == expected.dtype and tensor.shape == expected.shape
        assert torch.equal(tensor.view(torch.uint8), expected.view(torch.uint8))
    # One gather per parameter, each made only when its tensor was pulled.
    assert rank0["gathered_before"] == list(range(1, len(names) + 1))
    assert rank0["gathers"] == rank1["gathers"] == rank1["count"] == len(names)

    global_specs = [TensorSpec.of(n, t) for n, t in reference.items()]
    assert rank0["specs"] == rank1["specs"] == global_specs
    # The model was sharded: each rank held its rows of every parameter only.
    for spec in global_specs:
        shards = [r["local_shapes"][spec.name] for r in (rank0, rank1)]
        assert sum(s[0] for s in shards) == spec.shape[0]
        assert all(s[1:] == spec.shape[1:] for s in shards)
    assert any(rank1["local_shapes"][s.name][0] == 0 for s in global_specs)

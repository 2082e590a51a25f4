"""A first weight sync, checked: push changed weights into a running patched
SGLang server, then the checkpoint it serves, and compare its weights
checksum before and after (README "Try it on CPU").

    python examples/first_sync.py http://127.0.0.1:30000 [--admin-key K]

It needs only the `rlsync` library and torch, and the server's checkpoint on
this machine (it reads the model path from the server's `/server_info`, or
`--model-path`): the trainer's weights here are that checkpoint's tensors.

1. the engine's checksum now (the checkpoint it loaded);
2. a sync of every floating-point tensor plus 0.01: applied only once the
   engine verified every bucket's digest; the checksum must change;
3. a sync of the checkpoint's own tensors: the checksum must be the first
   one again, bit for bit, which no label or version can fake.

Each sync streams the tensors from disk as their buckets are packed: the
trainer holds two buckets at most, so a large checkpoint fits too. Exit 0
when all three hold. Use `--backend nccl` from a GPU trainer.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import torch

from rlsync import client
from rlsync.sender import Engine, WeightSender

# safetensors' dtype names (the file format is a JSON header and raw bytes;
# read here with the standard library so the trainer needs nothing more)
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    """A tensor of a .safetensors file: where its bytes are, not the bytes."""

    path: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    def read(self) -> torch.Tensor:
        raw = bytearray(self.end - self.start)
        with self.path.open("rb") as f:
            f.seek(self.start)
            f.readinto(raw)
        if not raw:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(raw, dtype=self.dtype).reshape(self.shape)


def stored_tensors(model_path: Path) -> list[StoredTensor]:
    """Every tensor of a checkpoint's .safetensors files, from their headers."""
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{model_path}: no .safetensors files")
    found = []
    for path in files:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            if spec["dtype"] not in DTYPES:
                raise SystemExit(f"{path}: {name} is {spec['dtype']}, not read here")
            start, end = (8 + header_len + offset for offset in spec["data_offsets"])
            dtype, shape = DTYPES[spec["dtype"]], tuple(spec["shape"])
            found.append(StoredTensor(path, name, dtype, shape, start, end))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checksum(engine: Engine) -> str:
    return client.weights_checksum(engine.url, **engine.keys)["checksum"]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--admin-key", help="the server's admin key, if it has one")
    parser.add_argument("--api-key", help="the server's --api-key, if it has one")
    parser.add_argument(
        "--model-path",
        type=Path,
        help="the checkpoint the server loaded (default: its /server_info's)",
    )
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument(
        "--wait", type=float, default=600.0, help="seconds to wait for /health"
    )
    return parser.parse_args(argv)


def wait_until_healthy(url: str, seconds: float) -> None:
    """Return once `url`'s /health is 200, saying every 30 s that it waits."""
    start = time.monotonic()
    said = None
    while True:
        try:
            if client.health(url, timeout=5) == 200:
                return
            why = "not healthy yet"
        except httpx.HTTPError as e:
            why = f"not answering yet ({type(e).__name__})"
        waited = time.monotonic() - start
        if waited > seconds:
            raise SystemExit(f"{url}: /health not 200 after {seconds:.0f} s: {why}")
        if said is None or waited - said >= 30:
            print(
                f"waiting for {url}/health: {why}; {waited:.0f} of {seconds:.0f} s",
                flush=True,
            )
            said = waited
        time.sleep(1.0)


def sync(
    sender: WeightSender, stored: list[StoredTensor], plus: float, version: str
) -> None:
    """Stream the checkpoint's tensors, each floating-point one plus `plus`:
    each is read from disk only while its bucket is packed, so the trainer
    holds at most two buckets, whatever the model's size."""

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for t in stored:
            tensor = t.read()
            # + 0.0 would turn -0.0 into 0.0: the checkpoint goes as it is
            changed = plus != 0.0 and tensor.is_floating_point()
            yield t.name, tensor + plus if changed else tensor

    specs = [(t.name, t.dtype, t.shape) for t in stored]
    result = sender.sync_stream(specs, tensors(), weight_version=version, atomic=True)
    print(
        f"synced {version!r}: {result.bytes / 2**20:.1f} MiB in "
        f"{result.buckets} bucket(s), {result.seconds:.2f} s, every bucket's "
        f"digest verified: {result.verified}"
    )


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    wait_until_healthy(args.url, args.wait)
    engine = Engine.from_server(
        args.url, admin_key=args.admin_key, api_key=args.api_key
    )
    model_path = args.model_path or Path(
        client.server_info(args.url, api_key=args.api_key)["model_path"]
    )
    stored = stored_tensors(model_path)
    print(f"{engine.url}: TP {engine.tp_size}, DP {engine.dp_size}, {model_path}")
    before = checksum(engine)
    print(f"checksum of the checkpoint it loaded:  {before}")
    sender = WeightSender([engine], master_port=free_port(), backend=args.backend)
    sender.connect()
    try:
        sync(sender, stored, 0.01, "first-sync-changed")
        after_change = checksum(engine)
        print(f"checksum after the changed weights:   {after_change}")
        sync(sender, stored, 0.0, "first-sync-restored")
        restored = checksum(engine)
        print(f"checksum after the checkpoint again:  {restored}")
    finally:
        sender.close()
    if after_change == before:
        print("FAIL: the changed weights did not change the checksum")
        return 1
    if restored != before:
        print("FAIL: the checkpoint synced back is not the checkpoint loaded")
        return 1
    print("ok: the engine applied both syncs, and holds its checkpoint bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())

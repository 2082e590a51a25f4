"""The series' torch-only weight-sync modules, loaded by file path without
importing sglang (the receive path is tested and benchmarked this way)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from harness import cpu_sglang

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = "python/sglang/srt/weight_sync/staged_receiver.py"
DIGEST = "python/sglang/srt/weight_sync/digest.py"
DIGEST_MODULE = "sglang.srt.weight_sync.digest"
# The modules beside it that the receiver imports (torch only), by the names
# it imports them under.
RECEIVER_IMPORTS = {
    DIGEST_MODULE: DIGEST,
    "sglang.srt.weight_sync.bucket_header": (
        "python/sglang/srt/weight_sync/bucket_header.py"
    ),
}


def series_source(rel: str) -> Path:
    """A shared series module's source: the developer worktree's copy where
    there is one, else common/'s."""
    path = ROOT / "build" / cpu_sglang.sglang_version() / "work" / rel
    return path if path.is_file() else ROOT / "common" / rel


def load_source(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load_receiver_source() -> ModuleType:
    """The server's staged_receiver and the modules it imports (they import
    only torch) from source, without importing sglang; its digest module is
    `sys.modules[DIGEST_MODULE + "_source"]`."""
    saved = {name: sys.modules.get(name) for name in RECEIVER_IMPORTS}
    for name, rel in RECEIVER_IMPORTS.items():
        sys.modules[name] = load_source(name + "_source", series_source(rel))
    try:
        return load_source("staged_receiver_source", series_source(RECEIVER))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module

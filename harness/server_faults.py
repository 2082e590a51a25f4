"""Faults injected into a real server's scheduler processes, for the paths
that a healthy CPU server never takes (a cache flush that fails on one TP
rank only, say).

`fault_env(tmp_dir, flush_cache_fails_on=[1])` returns the environment to
start the server with (`launch(..., env_overrides=...)`): a directory holding
a `sitecustomize` module on PYTHONPATH, which every process of the server
(schedulers are spawned interpreters) runs at start-up. It patches the named
scheduler method on the named TP ranks once SGLang's scheduler module is
imported; nothing else changes, and the series under test is untouched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

FAULTS_VARIABLE = "RLSYNC_TEST_SERVER_FAULTS"

_SITECUSTOMIZE = '''
"""Written by harness.server_faults: test faults in scheduler processes."""
import importlib.abc
import importlib.util
import json
import os
import sys

_FAULTS = json.loads(os.environ.get("{variable}") or "{{}}")
_MODULE = "sglang.srt.managers.scheduler"


def _patch(module):
    scheduler = module.Scheduler
    ranks = set(_FAULTS.get("flush_cache_fails_on", []))
    if ranks:
        flush_cache = scheduler.flush_cache

        def failing_flush_cache(self, *args, **kwargs):
            if self.tp_rank in ranks:
                return False
            return flush_cache(self, *args, **kwargs)

        scheduler.flush_cache = failing_flush_cache


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if _FAULTS:
    sys.meta_path.insert(0, _Finder())
'''


def fault_env(
    tmp_dir: Path, *, flush_cache_fails_on: Iterable[int] = ()
) -> dict[str, str]:
    """Environment overrides that start a server with these faults."""
    site = Path(tmp_dir) / "server-faults"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(
        _SITECUSTOMIZE.format(variable=FAULTS_VARIABLE)
    )
    faults = {"flush_cache_fails_on": sorted(set(flush_cache_fails_on))}
    path = [str(site)]
    tree = os.environ.get("RLSYNC_SGLANG_TREE")
    if tree:  # harness.cpu_sglang puts a developer's tree on PYTHONPATH
        path.append(str(Path(tree).resolve()))
    return {"PYTHONPATH": os.pathsep.join(path), FAULTS_VARIABLE: json.dumps(faults)}

"""Faults injected into a real server's scheduler processes, for the paths
that a healthy CPU server never takes (a cache flush that fails on one TP
rank only, say).

`fault_env(tmp_dir, flush_cache_fails_on=[1], refuse_staging_on=[1],
refuse_staging_while=path)` returns the environment to start the server with
(`launch(..., env_overrides=...)`): the cache flush fails on the named TP
ranks; prepare's staging check refuses (413) on the named TP ranks while the
file `path` exists (so a test turns the refusal on and off). It is a
directory holding
a `sitecustomize` module on PYTHONPATH, which every process of the server
(schedulers are spawned interpreters) runs at start-up. It patches the named
scheduler method on the named TP ranks once SGLang's scheduler module is
imported; nothing else changes, and the series under test is untouched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

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
    refusing = set(_FAULTS.get("refuse_staging_on", []))
    flag = _FAULTS.get("refuse_staging_while")
    if refusing and flag:
        from sglang.srt.weight_sync.staged_receiver import WeightsUpdateError

        check = scheduler._check_staging_budget

        def refusing_check(self, *args, **kwargs):
            if self.tp_rank in refusing and os.path.exists(flag):
                raise WeightsUpdateError(
                    f"buckets: staging refused on TP rank {{self.tp_rank}} "
                    f"(a test fault)",
                    status_code=413,
                )
            return check(self, *args, **kwargs)

        scheduler._check_staging_budget = refusing_check


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
    tmp_dir: Path,
    *,
    flush_cache_fails_on: Iterable[int] = (),
    refuse_staging_on: Iterable[int] = (),
    refuse_staging_while: Optional[Path] = None,
) -> dict[str, str]:
    """Environment overrides that start a server with these faults."""
    site = Path(tmp_dir) / "server-faults"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(
        _SITECUSTOMIZE.format(variable=FAULTS_VARIABLE)
    )
    faults = {
        "flush_cache_fails_on": sorted(set(flush_cache_fails_on)),
        "refuse_staging_on": sorted(set(refuse_staging_on)),
        "refuse_staging_while": (
            None if refuse_staging_while is None else str(refuse_staging_while)
        ),
    }
    path = [str(site)]
    tree = os.environ.get("RLSYNC_SGLANG_TREE")
    if tree:  # harness.cpu_sglang puts a developer's tree on PYTHONPATH
        path.append(str(Path(tree).resolve()))
    return {"PYTHONPATH": os.pathsep.join(path), FAULTS_VARIABLE: json.dumps(faults)}

"""`make soak`: fault-injection soak of the weight-update promises.

Starts a TP 1 and a TP 2 patched server on the CPU (one of them token-in,
token-out: `--skip-tokenizer-init`), keeps streaming and non-streaming
generation and a health poller running on each, and pushes weights into both
from a trainer in a subprocess, one sync after another, each with a fault drawn
at random (seeded). The trainer is rlsync's own `WeightSender`; each fault is
injected through its documented seams (`rlsync.wire.Wire`, the progress
callback, the tensor generator, calls another thread or the operator makes
meanwhile), never by a copy of the sync. After every sync it checks the
promises:

- nothing lost: every generation request completed or got a clean HTTP error
  (no hang past its deadline, no dropped connection, no truncated answer);
- all-or-nothing: each server serves exactly the old or exactly the new weight
  set by `/weights_checker` checksum (every set's checksum is measured on both
  servers before the soak), and what the answers claimed matches it;
- healthy and serving: both servers alive, `/health` 200 throughout, a request
  after the sync completes; each server's RSS (its whole process tree) within
  10 % of its level after its first sync;
- the group kept: a fault the trainer survives and reports in band (a refused
  prepare, an aborted stream, a corrupted byte, an abort after verify) needs
  no re-initialisation of the update group.

After a fault it recovers as a trainer would (re-initialise the group when
`SyncError.group_usable` is False, a new trainer process after a kill); a
server that fails its checks is restarted so the soak goes on. Writes
bench/results/soak-<date>.json and exits non-zero naming every check that
failed.

    python -m harness.soak [--syncs N] [--seed S] [--out PATH] [--faults a,b]

Modules: `faults` (the fault kinds, their seeded draws, and how each is
injected), `trainer` (the trainer process driving `WeightSender`), `load`
(generation and health traffic), `servers` (the servers across restarts),
`checks` (the promises checked after each sync), `report` (results file and
summary), `run` (the soak itself).
"""

from harness.soak.faults import FAULTS, KEEPS_GROUP, MUST_APPLY

__all__ = ["FAULTS", "KEEPS_GROUP", "MUST_APPLY"]

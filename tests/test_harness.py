"""The test harness's own promises that the other tests stand on."""

from __future__ import annotations

from harness.cpu_sglang import free_port


def test_free_port_never_hands_out_one_port_twice():
    # Two ports picked before either is bound (a group's and a store's)
    # must differ; at random from ~22,000 ports, 1,000 picks repeat one
    # with a probability above 99 %.
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)

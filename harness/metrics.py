"""Prometheus text (a server's or the router's `/metrics`) as samples a test
can read and compare before and after what it did."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

# (sample name, its labels) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families(text: str) -> dict[str, str]:
    """Metric name -> type (prometheus_client's optional `_created` left out)."""
    return {
        f.name: f.type
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")
    }


def scrape(url: str, timeout: float = 30.0) -> Samples:
    resp = requests.get(url + "/metrics", timeout=timeout)
    assert resp.status_code == 200, resp.text
    return parse(resp.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0 when absent."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, lbls), v in samples.items() if n == name and wanted <= lbls)

"""Read values from a Prometheus text exposition page (what ``/metrics`` serves)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of sample ``name`` whose labels are exactly ``labels`` (none if omitted).

    ``name`` is the sample's full name as exposed, e.g. ``reach_calls_total`` or
    ``reach_latency_seconds_bucket``. Returns ``None`` when no such sample is on the page
    (a labelled counter appears only once incremented; a gauge may be removed). Raises
    ``ValueError`` if ``text`` is not valid exposition format.
    """
    wanted = labels or {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == wanted:
                return sample.value
    return None


def scrape(base_url: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """GET ``base_url + "/metrics"`` and return ``metric_value`` of it."""
    response = httpx.get(f"{base_url}/metrics", timeout=10)
    response.raise_for_status()
    return metric_value(response.text, name, labels)

"""Prometheus, as the node-metrics agent asks it: a query function over prometheus-api-client, the scrape intervals of
the node exporters (which set the rate window: ``--rate-window auto``), and the observer's cores from a PromQL
expression (on Kubernetes, from cAdvisor)."""
from __future__ import annotations

MIN_WINDOW_S = 5
SCRAPES_PER_WINDOW = 3
"""irate needs two samples in its window; three scrape intervals still hold two when a scrape is late."""


def rate_window_s(scrape_intervals_s) -> int:
    """The rate window for node exporters scraped at these intervals (seconds)."""
    import math

    return max(MIN_WINDOW_S, math.ceil(SCRAPES_PER_WINDOW * max(scrape_intervals_s, default=0)))


def node_scrape_intervals(prom) -> list[float]:
    """The scrape intervals (s) of the jobs that scrape node exporters, from Prometheus' targets API (a job is a node
    exporter's when its series include ``node_uname_info``)."""
    from core.units import parse_duration_ns

    jobs = {s["metric"].get("job") for s in prom.custom_query("count by (job) (node_uname_info)")}
    targets = prom.get_targets().get("activeTargets", [])
    return [parse_duration_ns(t["scrapeInterval"]) / 1e9 for t in targets
            if t.get("labels", {}).get("job") in jobs and t.get("scrapeInterval")]


def promql_observer(query, promql: str):
    """``observer`` for ``NodeMetrics`` from Prometheus: ``promql`` gives cores per ``node`` (or ``instance``) label."""
    def observe(at_ns: int) -> list[tuple[str, float | None]]:
        out = []
        for series in query(promql, at_ns / 1e9, 0.5):
            labels = series["metric"]
            out.append((labels.get("node") or labels.get("instance", "?"), float(series["value"][1])))
        return out
    return observe


def prometheus_query(url: str, prom=None):
    """A query function over prometheus-api-client: (promql, eval time s, timeout s) -> result list."""
    prom = prom or prometheus_client(url)

    def query(promql: str, at_s: float, timeout_s: float):
        return prom.custom_query(promql, params={"time": f"{at_s:.3f}", "timeout": f"{max(1, int(timeout_s * 1000))}ms"},
                                 timeout=timeout_s)
    return query


def prometheus_client(url: str):
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    return PrometheusConnect(url=url, disable_ssl=True, retry=Retry(total=0))

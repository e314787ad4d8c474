"""The embedded Prometheus' settings: its memory budget and its scrape configuration (``stack.__main__`` starts it)."""
from __future__ import annotations

from core.procs import HOST

PROMETHEUS_GO_MEMORY = {"GOGC": "off", "GOMEMLIMIT": "96MiB", "GODEBUG": "madvdontneed=0"}
"""The embedded Prometheus collects when its heap reaches a fixed budget (set GOGC or GOMEMLIMIT to change it), as a
JVM with a fixed heap does. With Go's default (collect when the heap doubles), its resident memory drifted up by
a fifth over 15 minutes, 29 -> 36 MiB, with 20 MiB in use throughout: the runtime keeps what it freed up to the
next collection's goal, and reaches it slowly. Its ~500 series need ~20 MiB; the budget is reached ~2 minutes after
start. Pages it frees after a collection are handed back lazily (MADV_FREE: the kernel takes them when it needs
them), so it stays at the budget rather than swinging 74-84 MiB between collections."""


def prometheus_config(node_exporter_port: int, flightwatch: dict[str, int] | None = None) -> str:
    """Every second: the node exporter, and flightwatch's own /metrics (``flightwatch``: job name -> port)."""
    return "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n" + "".join(
        f"  - job_name: {name}\n    static_configs:\n      - targets: ['{HOST}:{port}']\n"
        for name, port in {"node": node_exporter_port, **(flightwatch or {})}.items())

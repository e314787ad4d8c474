"""The spool writer's resident memory stays bounded while its segment fills (a real memory-mapped file and the
kernel's own accounting, /proc/self/status), and every line it wrote is in the file."""
from __future__ import annotations

import os

from agents.spool import MAPPED_BYTES, SpoolWriter


def _rss_file_kib() -> int:
    """Resident file-backed and shared pages of this process (a MAP_SHARED file mapping counts in one or the other)."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return sum(int(fields[k].split()[0]) for k in ("RssFile", "RssShmem") if k in fields)


def test_a_filling_segment_keeps_only_its_newest_pages_mapped(tmp_path):
    w = SpoolWriter(str(tmp_path), segment_bytes=64 << 20, budget_bytes=2 << 30, agent="t")
    line = '{"kind":"recv","run_id":"r","agent":"t","at_ns":1795650000000000000,"event_id":"loadgen-%08d"}'
    before = _rss_file_kib()
    n = 400_000  # ~40 MiB into one 64 MiB segment: a day of receives at the HTTP receiver
    for i in range(n):
        w.append(line % i)
    grown_mib = (_rss_file_kib() - before) / 1024
    assert w.seq == 1 and w.pos > 30 << 20  # one segment, filled well past what stays mapped
    assert grown_mib <= 2 * MAPPED_BYTES / (1 << 20) + 1, grown_mib  # was ~the segment's written size (~39 MiB)
    w.close()
    seg = os.path.join(str(tmp_path), sorted(os.listdir(tmp_path))[0])
    lines = open(seg).read().splitlines()
    assert len(lines) == n and lines[0] == line % 0 and lines[-1] == line % (n - 1)  # nothing lost by the unmapping

"""Clock offset against the reference, NTP-style, over real UDP on loopback."""
from __future__ import annotations

import subprocess
import sys

from support import ROOT, free_port

from core import clock, contract


def test_offset_of_a_skewed_reference_is_found_within_its_round_trip():
    for skew_ms in (250, -1_700, 0):
        ref = clock.ClockReference("127.0.0.1", 0, skew_ns=skew_ms * 10**6).start()
        try:
            offset_ns, rtt_ns = clock.estimate(ref.address)
        finally:
            ref.close()
        assert 0 < rtt_ns < 20 * 10**6
        assert abs(offset_ns - skew_ms * 10**6) <= max(rtt_ns // 2, 10**6)  # within ± rtt/2 (1 ms at least)


def test_record_and_silent_reference():
    ref = clock.ClockReference("127.0.0.1", 0, skew_ns=5 * 10**6).start()
    try:
        rec = clock.estimate_record(ref.address, "receiver-x")
    finally:
        ref.close()
    assert rec.run_id == contract.ANY_RUN and rec.reference == ref.address and abs(rec.offset_us - 5000) < 1000
    assert contract.decode(contract.encode([rec])) == [rec]
    assert clock.estimate(f"127.0.0.1:{free_port()}", samples=2, timeout_s=0.1) is None
    assert clock.estimate_record("not-an-address", "x") is None


def test_cli():
    run = lambda *a: subprocess.run([sys.executable, "-m", "agents.clock", *a], cwd=ROOT, capture_output=True, text=True, timeout=30)
    bad = run("probe", "nohostport")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "HOST:PORT" in bad.stderr
    assert run("probe", f"127.0.0.1:{free_port()}").returncode == 1
    assert run("--help").returncode == 0

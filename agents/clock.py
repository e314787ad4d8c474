"""The clock reference and its probe, as a command (the exchange itself is ``core.clock``).

    python -m agents.clock serve [--listen 127.0.0.1:19123]   serve the reference (the node-metrics agent does too)
    python -m agents.clock probe [127.0.0.1:19123]            print this host's offset against a reference

Agents on different hosts stamp with different clocks; each runs NTP-style exchanges against one reference
and writes a ``clock`` record with its offset and the round trip.
"""
from __future__ import annotations

import argparse
import sys
import time

from core import settings
from core.cli import OneLineParser
from core.clock import DEFAULT_REFERENCE, ClockReference, estimate, split_address


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m agents.clock", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve", help="serve the clock reference")
    sv.add_argument("--listen", default=DEFAULT_REFERENCE)
    pr = sub.add_parser("probe", help="print this host's offset against a reference")
    settings.add(pr, "FLIGHTWATCH_CLOCK_REFERENCE", "reference", nargs="?", default=DEFAULT_REFERENCE,
                 help="the reference's HOST:PORT")
    try:
        a = ap.parse_args(argv)
        address = split_address(a.listen if a.cmd == "serve" else a.reference)
    except SystemExit as e:
        return 2 if e.code else 0
    except ValueError as e:
        print(f"clock: error: {e}", file=sys.stderr)
        return 2
    if a.cmd == "probe":
        est = estimate(a.reference)
        if est is None:
            print(f"clock: error: no answer from {a.reference}", file=sys.stderr)
            return 1
        print(f"offset {est[0] / 1e6:+.3f} ms (reference - this host), round trip {est[1] / 1e6:.3f} ms")
        return 0
    try:
        ref = ClockReference(*address).start()
    except OSError as e:
        print(f"clock: error: cannot listen on {a.listen}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"clock reference on udp://{ref.address}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        ref.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

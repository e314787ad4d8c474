"""Command-line helpers shared by every command: a bad flag is one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import sys

from core.units import one_line, split_host_port


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (``prog: error: ...``), without the usage block, and exit code 2;
    ``--help`` still shows everything. Its subparsers are of this class too."""

    def error(self, message: str):
        print(f"{self.prog}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(2)


def bootstrap_arg(text: str) -> str:
    """An argparse ``type``: Kafka bootstrap servers, ``HOST:PORT[,HOST:PORT...]``."""
    try:
        for server in str(text).split(","):
            split_host_port(server, "bootstrap server", "127.0.0.1:19092")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text

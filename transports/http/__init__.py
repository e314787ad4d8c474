"""CloudEvents over HTTP: the target (``target``, on its client ``client``), the sink that receives (``receiver`` on
its HTTP/1.1 server ``server``) and its process (``process``)."""
from __future__ import annotations

from transports.base import Transport
from transports.http import process, receiver
from transports.http.target import HttpTarget

TRANSPORT = Transport("http", HttpTarget, "CloudEvents HTTP sink (binary, structured and batched modes)",
                      receiver, process.add_flags, process.main, stack_flags=process.stack_flags,
                      sink=True, stack_port=("FLIGHTWATCH_RECEIVER_PORT", 18080))

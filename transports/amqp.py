"""AMQP addresses, shared by the load generator's targets and the receivers. AMQP 0-9-1 (RabbitMQ): RabbitMQ's URI spec
(``amqp://user:password@host:port/vhost``, the vhost percent-encoded, ``%2F`` for ``/``) with flightwatch's own
query options beside the client's.

    amqp://guest:guest@127.0.0.1:29672/%2F?queue=flightwatch.sut          the default exchange, to a queue
    amqp://guest:guest@127.0.0.1:29672/%2F?exchange=events&routing_key=a.b  an exchange and a routing key
    ...&durable=true    a durable queue and persistent messages (delivery mode 2)
    ...&declare=false   the queue must exist (a missing one is an error, not created)
    ...&heartbeat=30    any other option is pika's own (heartbeat, frame_max, connection_attempts, ...)
    amqp://...?exchange=fw.topic&bindings=100                        a topic exchange, 100 queues, one binding each
                        (RabbitMQ's "Measuring Scalability" method: event k is published with the routing key
                        fw.<k mod 100>; the receiver declares the exchange, the queues fw.topic.q0 ... and their
                        bindings, and consumes every queue)

AMQP 1.0 (Artemis, RabbitMQ's plugin, Dispatch Router): ``amqp1://user:password@host:port/ADDRESS``
(``Amqp1Address``).

Events follow the CloudEvents AMQP binding's names: the attributes as ``cloudEvents_*`` headers (0-9-1) or
application properties (1.0), the event ID also as the message ID; the send stamp rides in ``fw_sent_ns`` (epoch ns,
an AMQP long), since AMQP 0-9-1's ``timestamp`` holds seconds.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from core import metrics, secrets, settings, tls
from core.procs import AMQP_RECEIVER_METRICS_PORT, HOST
from core.rundir import ROOT

CE_PREFIX = "cloudEvents_"
ID_HEADER = CE_PREFIX + "id"
RUN_HEADER = CE_PREFIX + "fwrun"
SENT_HEADER = "fw_sent_ns"
SCHEMES = ("amqp", "amqps")
SCHEMES_1 = ("amqp1", "amqp1s")
SECURE, SECURE_1 = {"amqp": "amqps"}, {"amqp1": "amqp1s"}
"""AMQP 0-9-1's and AMQP 1.0's plain scheme with its TLS form (their targets' ``SECURE``)."""
OURS = ("queue", "exchange", "routing_key", "durable", "declare", "bindings", tls.OPTION)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
MAX_PAIRS = 5000
"""Pairs (AMQP 1.0) or bindings (0-9-1) at most: a link each way, or a queue and a consumer, each."""


@dataclass(frozen=True)
class AmqpAddress:
    vhost: str
    queue: str | None
    exchange: str
    routing_key: str
    durable: bool = False
    declare: bool = True
    client_query: str = ""     # what is left for pika's URLParameters
    bindings: int = 0          # given: a topic exchange, a queue and a binding for each routing key (``routes``)
    tls: tls.Tls | None = None  # amqps://: the broker's certificate checked against ?cafile= (core.tls)

    @classmethod
    def parse(cls, path: str, query: str, scheme: str = "amqp") -> AmqpAddress:
        """``ValueError`` saying what is wrong; ``path`` as in the URL (``/vhost``, percent-encoded; none, or ``/``
        alone, is RabbitMQ's default vhost ``/``); ``scheme`` ``amqps`` for TLS."""
        vhost = unquote(path[1:]) if path.startswith("/") and len(path) > 1 else "/"
        if "/" in path[1:]:
            raise ValueError(f"the path is the virtual host, one segment ({path!r}): write '/' as %2F")
        opts = dict(parse_qsl(query, keep_blank_values=True))
        rest = {k: v for k, v in opts.items() if k not in OURS}
        queue, exchange = opts.get("queue") or None, opts.get("exchange", "")
        if queue is None and not exchange:
            raise ValueError("name a queue (?queue=NAME) or an exchange (?exchange=NAME&routing_key=KEY)")
        if queue is not None and exchange:
            raise ValueError("give ?queue= or ?exchange=, not both")
        flags = {}
        for name, default in (("durable", False), ("declare", True)):
            text = opts.get(name, "").lower()
            if text and text not in _TRUE + _FALSE:
                raise ValueError(f"?{name}={opts[name]!r}: true or false")
            flags[name] = default if not text else text in _TRUE
        bindings = opts.get("bindings", "0")
        if not bindings.isdigit() or not 0 <= int(bindings) <= MAX_PAIRS:
            raise ValueError(f"?bindings={bindings!r}: a number of queues bound to the exchange, 1 to {MAX_PAIRS:,}")
        if "bindings" in opts and (not exchange or not int(bindings)):
            raise ValueError("?bindings=N needs ?exchange=NAME (the topic exchange the queues are bound to) and N >= 1")
        return cls(vhost, queue, exchange, opts.get("routing_key", "fw" if int(bindings) else queue or ""),
                   client_query=urlencode(rest), bindings=int(bindings), tls=tls.Tls.of(scheme, query, SECURE), **flags)

    def routes(self) -> list[tuple[str, str]]:
        """With ``bindings``: each queue and its binding key, ``(EXCHANGE.q<i>, ROUTING_KEY.<i>)``."""
        return [(f"{self.exchange}.q{i}", f"{self.routing_key}.{i}") for i in range(self.bindings)]

    @classmethod
    def from_url(cls, url: str) -> tuple[AmqpAddress, object]:
        """The address in a whole URL, and pika's connection parameters for it; ``ValueError`` naming the URL
        (password hidden)."""
        from urllib.parse import urlsplit

        u = urlsplit(url)
        shown = url.replace(f":{u.password}@", ":***@", 1) if u.password else url
        try:
            if u.scheme not in SCHEMES or not u.hostname:
                raise ValueError("amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME (amqps:// for TLS)")
            address = cls.parse(u.path or "/", u.query, u.scheme)
            userinfo = secrets.userinfo(u.username, u.password)
            return address, address.pika_params(u.hostname, u.port or default_port(u.scheme), userinfo)
        except ValueError as e:
            raise ValueError(f"bad AMQP address {shown!r}: {e}") from None

    def pika_url(self, host: str, port: int, userinfo: str | None) -> str:
        """The address as pika's ``URLParameters`` takes it (guest/guest when the URL names no user)."""
        user, _, password = (userinfo or "guest:guest").partition(":")
        return (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{quote(self.vhost, safe='')}"
                + (f"?{self.client_query}" if self.client_query else ""))

    def pika_params(self, host: str, port: int, userinfo: str | None):
        """pika's ``URLParameters`` for the address, with TLS (the certificate and ``host`` checked) for amqps."""
        import pika

        params = pika.URLParameters(self.pika_url(host, port, userinfo))
        if self.tls is not None:
            params.ssl_options = pika.SSLOptions(self.tls.context(), server_hostname=host)
        return params

    def where(self) -> str:
        """Where the events go, as a line shows it."""
        if self.bindings:
            return (f"topic exchange {self.exchange}, {self.bindings:,} queues bound with keys {self.routing_key}.0 ... "
                    f".{self.bindings - 1} on vhost {self.vhost}")
        return (f"queue {self.queue}" if self.queue else f"exchange {self.exchange} key {self.routing_key}") + \
            f" on vhost {self.vhost}"


SETTLE_MODES = ("unsettled", "presettled")


@dataclass(frozen=True)
class Amqp1Address:
    """An AMQP 1.0 link address: the URL's path less its first ``/`` (``amqp1://h:p/orders`` is ``orders``;
    RabbitMQ 3.x's plugin names a queue ``/queue/NAME``, so ``amqp1://h:p//queue/NAME``), how transfers settle:
    ``?settle=unsettled`` (at least once: each waits for the broker's outcome; the default) or ``presettled`` (at
    most once), and ``?durable=true``: each message's header says durable (a broker keeps it on disk across a
    restart; without a header it is not durable, AMQP 1.0's default), and each link's terminus at the broker is
    durable (``configuration``: RabbitMQ 3.x's plugin declares ``/queue/NAME`` durable only then). ``?pairs=N``: N
    sender-receiver pairs, each on its own address ``ADDRESS.0`` ... ``ADDRESS.<N-1>`` over one connection (the
    Dispatch Router tests' method): the load generator sends event k to pair k mod N, the receiver consumes all N."""
    address: str
    settle: str = "unsettled"
    durable: bool = False
    pairs: int = 1
    tls: tls.Tls | None = None  # amqp1s://: the broker's certificate and name checked against ?cafile= (core.tls)

    @classmethod
    def parse(cls, path: str, query: str, scheme: str = "amqp1") -> Amqp1Address:
        address = unquote(path[1:]) if path.startswith("/") else unquote(path)
        if not address:
            raise ValueError("name an address: amqp1://HOST:PORT/ADDRESS (RabbitMQ: //queue/NAME)")
        opts = dict(parse_qsl(query, keep_blank_values=True))
        unknown = sorted(set(opts) - {"settle", "durable", "pairs", tls.OPTION})
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}: amqp1:// takes ?settle=unsettled|presettled, "
                             "?durable=true|false and ?pairs=N (amqp1s:// also ?cafile=PATH)")
        pairs = opts.get("pairs", "1")
        if not pairs.isdigit() or not 1 <= int(pairs) <= MAX_PAIRS:
            raise ValueError(f"?pairs={pairs!r}: a number of sender-receiver pairs, 1 to {MAX_PAIRS:,}")
        settle = opts.get("settle", "unsettled")
        if settle not in SETTLE_MODES:
            raise ValueError(f"?settle={settle!r}: unsettled or presettled")
        durable = opts.get("durable", "false").lower()
        if durable not in _TRUE + _FALSE:
            raise ValueError(f"?durable={opts['durable']!r}: true or false")
        return cls(address, settle, durable in _TRUE, int(pairs), tls.Tls.of(scheme, query, SECURE_1))

    @classmethod
    def from_url(cls, url: str) -> tuple[Amqp1Address, str, int, str | None]:
        """The address in a whole URL, with its host, port and ``user:password``; ``ValueError`` naming the URL."""
        from urllib.parse import urlsplit

        u = urlsplit(url)
        shown = url.replace(f":{u.password}@", ":***@", 1) if u.password else url
        try:
            if u.scheme not in SCHEMES_1 or not u.hostname:
                raise ValueError("amqp1://USER:PASS@HOST:PORT/ADDRESS (amqp1s:// for TLS)")
            userinfo = secrets.userinfo(u.username, u.password)
            return cls.parse(u.path, u.query, u.scheme), u.hostname, u.port or default_port(u.scheme), userinfo
        except ValueError as e:
            raise ValueError(f"bad AMQP 1.0 address {shown!r}: {e}") from None


def default_port(scheme: str) -> int:
    """AMQP's port (5672), or AMQPS' (5671) for a TLS scheme."""
    return 5671 if scheme in (*SECURE.values(), *SECURE_1.values()) else 5672


ATTACHED_FILE = "attached.json"


def write_attached(state_dir: str, address, attached_ns: int) -> None:
    """A receiver's word that every link of its pairs (AMQP 1.0), or every queue of its bindings (0-9-1), is attached
    and consumed (``ATTACHED_FILE`` in its state folder, ``count`` of them): a scenario starts no sender before it
    (``read_attached``)."""
    tmp = os.path.join(state_dir, f".{ATTACHED_FILE}.tmp")
    with open(tmp, "w") as f:
        count = address.pairs if isinstance(address, Amqp1Address) else address.bindings
        json.dump({"address": getattr(address, "address", None) or address.exchange, "count": count,
                   "attached_ns": attached_ns}, f)
    os.replace(tmp, os.path.join(state_dir, ATTACHED_FILE))


def read_attached(state_dir: str) -> dict | None:
    """What ``write_attached`` wrote in ``state_dir``, or None."""
    try:
        with open(os.path.join(state_dir, ATTACHED_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def condition_text(what: str, cond) -> str:
    """An AMQP 1.0 error condition as a short, stable cause: ``link closed: not found``."""
    if cond is None or str(cond.name).startswith("proton."):  # proton's own I/O condition: the socket went away
        return what
    return f"{what}: {str(cond.name).rsplit(':', 1)[-1].replace('-', ' ')}"


def quiet_clients() -> None:
    """pika and proton log every connection step at INFO: their warnings are enough beside flightwatch's own lines."""
    import logging

    for name in ("pika", "proton"):
        logging.getLogger(name).setLevel(logging.WARNING)


PIKA_TESTED = "1.4.4"
"""The pika that the AMQP 0-9-1 target is built and tested with (pyproject.toml pins it): the target writes through
private parts of it (``PIKA_PRIVATE``), checked before its first connection (``require_pika_internals``)."""
PIKA_PRIVATE = (
    ("pika.connection", "Connection", "_output_marshaled_frames"),   # the target hands its publish frames to it
    ("pika.connection", "Connection", "_body_max_length"),           # where a body is cut into frames (set on tune)
    ("pika.adapters.utils.io_services_utils", "_AsyncTransportBase", "_produce"),     # coalesce_pika_writes wraps it
    ("pika.adapters.utils.io_services_utils", "_AsyncTransportBase", "_tx_buffers"),  # ... and joins these
)


class PikaMismatch(ValueError):
    """The installed pika lacks a private part the AMQP 0-9-1 target writes through: one line, before any send."""


@functools.cache
def require_pika_internals() -> None:
    """``PikaMismatch`` naming the first of ``PIKA_PRIVATE`` that the installed pika lacks (a method or class
    attribute, or an attribute its ``__init__`` or a method sets on ``self``) and the version flightwatch is tested
    with. Checked once a process: a pika that renamed one would otherwise fail every send, and the failures would read
    as the SUT's."""
    import importlib
    import inspect

    import pika

    for module, cls, name in PIKA_PRIVATE:
        klass = getattr(importlib.import_module(module), cls, None)
        if klass is not None and (hasattr(klass, name) or f"self.{name} " in inspect.getsource(klass)
                                  or f"self.{name}:" in inspect.getsource(klass)):
            continue
        raise PikaMismatch(f"pika {pika.__version__} lacks {cls}.{name}, which flightwatch's AMQP 0-9-1 target writes "
                           f"through: flightwatch is tested with pika {PIKA_TESTED} (pip install pika=={PIKA_TESTED}, "
                           "or make install)")


def coalesce_pika_writes() -> None:
    """pika 1.4's transport writes what it has buffered one frame at a time: three ``send()`` calls a publish (method,
    header, body). In the load generator at 5,000/s those calls were 30% of its samples (py-spy). Patched here, once
    per process, to join what is buffered into one ``send()`` a writable turn; pika's own loop does the rest (partial
    sends, errors, its TLS transport on top)."""
    from pika.adapters.utils import io_services_utils as io

    require_pika_internals()
    base = io._AsyncTransportBase
    if getattr(base._produce, "coalesced", False):
        return
    original = base._produce

    def _produce(self) -> None:
        buffers = self._tx_buffers
        if len(buffers) > 1:
            joined = b"".join(buffers)
            buffers.clear()
            buffers.append(joined)
        original(self)
    _produce.coalesced = True
    base._produce = _produce


def open_failure(error: BaseException) -> str:
    """Why a connection did not open, as one line: a TLS failure named with what to do (``core.tls``), else the
    broker's cause with its words (of pika's last attempt, when it made several)."""
    found = tls.cause(repr(error))
    if found is not None:
        return found
    inner = (getattr(error, "exceptions", None) or (error,))[-1]
    return f"{close_cause(inner)} ({inner})"


def close_cause(error: BaseException | None) -> str:
    """A connection or channel close as a short, stable cause: the broker's reply text's first word (``NOT_FOUND``,
    ``ACCESS_REFUSED``, ``PRECONDITION_FAILED``, ...) or the exception's kind."""
    if error is None:
        return "closed"
    reply = re.search(r"'([A-Z][A-Z_]+) - ", str(error))  # the broker's reply, however pika wrapped it
    if reply:
        return reply.group(1).lower().replace("_", " ")
    args = getattr(error, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        text = str(args[1]).split(" ", 1)[0]
        return text.lower().replace("_", " ") if text else f"closed {args[0]}"
    name = type(error).__name__
    return {"ProbableAuthenticationError": "access refused", "ProbableAccessDeniedError": "access refused",
            "AuthenticationError": "access refused", "StreamLostError": "connection lost",
            "AMQPConnectionError": "connection refused", "IncompatibleProtocolError": "not amqp 0-9-1",
            "ConnectionClosedByBroker": "closed by broker"}.get(name, name)


# --- what both AMQP receivers share: their flags, metric families and progress line ----------------------------------

CONNECT_S = 15.0
"""How long a receiver's first connection may take before the agent gives up (exit 2)."""


def add_amqp_flags(q: argparse.ArgumentParser, agent: str) -> None:
    """The flags both AMQP receivers have: their state folder, spool budget and /metrics."""
    q.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", agent),
                   help="where the telemetry spool (<state-dir>/spool) and the shipper's log live (default %(default)s)")
    q.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the telemetry spool may hold while the telemetry broker is away (default %(default)s)")
    settings.add(q, "FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", "--metrics-listen", type=metrics.listen_arg,
                 default=f"{HOST}:{AMQP_RECEIVER_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve Prometheus metrics here ('none': not at all)")


def amqp_families(receiver):
    """An AMQP receiver's counters (0-9-1's or 1.0's) as Prometheus metric families, read at scrape time."""
    from core.metrics import family

    c, agent = receiver.counters(), receiver.agent
    for name, key, text in (("events", "received", "deliveries recorded (attributed to a run)"),
                            ("unattributed", "unattributed", "deliveries without a run or event ID, not recorded"),
                            ("redelivered", "redelivered", "deliveries the broker marked as redelivered"),
                            ("malformed", "malformed", "deliveries that were no AMQP 1.0 message, accepted and "
                             "not recorded"),
                            ("connection_losses", "connection_losses", "connections to the broker lost")):
        if key not in c:  # malformed: AMQP 1.0's receiver reads the message itself
            continue
        yield family("counter", f"flightwatch_amqp_receiver_{name}", text, ["agent"], [((agent,), c[key])])
    yield family("gauge", "flightwatch_amqp_receiver_connected", "1 while consuming", ["agent"],
                 [((agent,), c["connected"])])
    t = c.get("telemetry", {})
    yield family("counter", "flightwatch_amqp_receiver_telemetry_records", "receive records spooled, and lost past "
                 "the spool's budget", ["agent", "state"], [((agent, s), t.get(s, 0)) for s in ("spooled", "lost")])


def amqp_progress(receiver, odd: str) -> tuple[tuple, str]:
    """An AMQP receiver's progress line and the figures it says (``odd``: its own count, redelivered or malformed)."""
    c = receiver.counters()
    t = c.get("telemetry", {})
    return ((c["received"], c["unattributed"], c[odd], c["connection_losses"], t.get("lost", 0)),
            f"receiver {receiver.agent}: {c['received']:,} received, {c['unattributed']:,} without run/event ID, "
            f"{c[odd]:,} {odd}, {c['connection_losses']} connections lost; telemetry spooled "
            f"{t.get('spooled', 0):,} lost {t.get('lost', 0):,}")

"""The transport registry and its addresses: every scheme parses through one table, each transport keeps the one
contract, and no module outside the registry branches on a scheme."""
from __future__ import annotations

import ast
import os
import tempfile

import pytest

from transports.amqp import AmqpAddress, close_cause
from transports.base import Target
from transports.registry import TRANSPORTS, TargetSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("url, scheme, port, path, query", [
    ("http://127.0.0.1:8080/broker", "http", 8080, "/broker", ""),             # a URL path
    ("http+structured://h/", "http+structured", 80, "/", ""),                   # HTTP's default port
    ("kafka://127.0.0.1:29092/flightwatch.sut", "kafka", 29092, "flightwatch.sut", ""),  # the path is the topic
    ("kafka://h/t", "kafka", 9092, "t", ""),                                    # Kafka's default port
    ("amqp://guest:guest@127.0.0.1:29672/%2F?queue=q", "amqp", 29672, "/%2F", "queue=q"),  # the vhost '/'
    ("amqp://h?queue=q", "amqp", 5672, "/", "queue=q"),                         # no path: the default vhost
    ("amqp://h/v?exchange=x&routing_key=a.b", "amqp", 5672, "/v", "exchange=x&routing_key=a.b"),  # an exchange
    ("amqp1://h:61616/orders", "amqp1", 61616, "/orders", ""),                 # AMQP 1.0: an Artemis address
    ("amqp1://h//queue/q?settle=presettled", "amqp1", 5672, "//queue/q", "settle=presettled"),  # RabbitMQ's /queue/Q
])
def test_every_transport_parses_through_the_registry(url, scheme, port, path, query):
    spec = TargetSpec.parse(url)
    assert (spec.scheme, spec.port, spec.path, spec.query) == (scheme, port, path, query)


@pytest.mark.parametrize("url, words", [
    ("ftp://h/x", "amqp://USER:PASSWORD@HOST:PORT/VHOST"),      # an unknown scheme lists every transport's form
    ("kafka://h:1/", "needs a topic"),                           # a topic is needed
    ("kafka://u:p@h:1/t", "FLIGHTWATCH_SUT_KAFKA_OPTIONS"),      # Kafka's credentials are client options
    ("amqp://h/%2F", "name a queue"),                            # an AMQP target names a queue or an exchange
    ("amqp://h/?queue=a&exchange=b", "not both"),                # not both
    ("amqp://h/a/b?queue=q", "one segment"),                     # a vhost with a slash must be encoded
    ("amqp://h/?queue=q&durable=maybe", "true or false"),        # flags are booleans
    ("amqp://h:99999/?queue=q", "bad port"),                     # a port out of range
    ("amqp1://h/", "name an address"),                           # AMQP 1.0 needs an address
    ("amqp1://h/q?settle=maybe", "unsettled or presettled"),     # two ways to settle
    ("amqp1://h/q?durable=maybe", "true or false"),             # durable is a boolean
    ("amqp1://h/q?queue=q", "unknown option 'queue'"),           # no other option
])
def test_a_malformed_address_is_one_line_naming_it(url, words):
    with pytest.raises(ValueError) as e:
        TargetSpec.parse(url)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("url", ["amqp1://h//queue/q", "amqp1://h:61616/orders?settle=presettled",
                                 "amqp://h:1/%2F?queue=q", "kafka://h:1/t", "http://h:1/a/b"])
def test_an_address_prints_as_it_parses(url):
    spec = TargetSpec.parse(url)
    assert TargetSpec.parse(str(spec)) == spec  # the run's start marker carries str(spec)


def test_amqp_1_0_addresses():
    from transports.amqp import Amqp1Address

    assert Amqp1Address.parse("//queue/q", "") == Amqp1Address("/queue/q", "unsettled")
    assert Amqp1Address.from_url("amqp1://u:p@h:7/a%2Fb?settle=presettled") == (
        Amqp1Address("a/b", "presettled"), "h", 7, "u:p")
    assert Amqp1Address.parse("/q", "durable=true") == Amqp1Address("q", "unsettled", True)


def test_a_password_in_an_amqp_address_is_never_shown():
    spec = TargetSpec.parse("amqp://fw:s3cret@h/%2F?queue=q")
    assert "s3cret" not in str(spec) + repr(spec)
    with pytest.raises(ValueError) as e:
        TargetSpec.parse("amqp://fw:s3cret@h/%2F")
    assert "s3cret" not in str(e.value) and "***" in str(e.value)


@pytest.mark.parametrize("path, query, want", [
    ("/%2F", "queue=q", ("/", "q", "", "q", False, True)),                       # default exchange, key = queue
    ("/prod", "queue=q&durable=true&declare=false", ("prod", "q", "", "q", True, False)),  # durable, must exist
    ("/", "exchange=x&routing_key=k&heartbeat=30", ("/", None, "x", "k", False, True)),  # pika keeps the rest
])
def test_amqp_addresses(path, query, want):
    a = AmqpAddress.parse(path, query)
    assert (a.vhost, a.queue, a.exchange, a.routing_key, a.durable, a.declare) == want
    assert a.pika_url("h", 1, None).startswith("amqp://guest:guest@h:1/")
    assert ("heartbeat=30" in a.pika_url("h", 1, None)) == ("heartbeat" in query)


@pytest.mark.parametrize("error, cause", [
    (Exception(530, "NOT_ALLOWED - vhost nope not found"), "not allowed"),       # the broker's reply code word
    (Exception("(403) 'ACCESS_REFUSED - Login was refused'"), "access refused"),  # wrapped by pika
    (ConnectionRefusedError(), "ConnectionRefusedError"),                          # else the exception's kind
])
def test_a_close_is_named_by_the_brokers_reply(error, cause):
    assert close_cause(error) == cause


def test_every_transport_keeps_the_contract():
    members = [m for m in dir(Target) if not m.startswith("_")]
    for scheme, cls in TRANSPORTS.items():
        missing = [m for m in members if not hasattr(cls, m)]
        assert not missing, (scheme, missing)
        assert scheme in cls.SCHEMES


def transport_names() -> set[str]:
    """Every name a transport goes by, from the registries: its schemes, receiver modes, SUTs and the stack's
    components that run its broker and its receiver."""
    from core.suts import SUTS
    from transports.registry import RECEIVERS

    return ({*TRANSPORTS, *RECEIVERS, *SUTS, *(f"{mode}-receiver" for mode in RECEIVERS)}
            | {name for sut in SUTS.values() for name in (sut.broker, sut.receiver)})


def transport_modules() -> set[str]:
    """The modules that are a transport's own: all of ``transports/``, and its broker, from the registries."""
    import importlib.util

    from core.suts import SUTS

    modules = {f"stack.{name}" for sut in SUTS for name in (sut, SUTS[sut].broker)}
    specs = [importlib.util.find_spec(m) for m in modules if "-" not in m]
    own = {os.path.relpath(spec.origin, ROOT) for spec in specs if spec is not None}
    for folder, _, files in os.walk(os.path.join(ROOT, "transports")):  # the transports' own packages
        own |= {os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py")}
    return own


REGISTRIES = ("TRANSPORTS", "RECEIVERS", "SUTS", "BROKERS")
NOT_A_TRANSPORT = {("streaming/job.py", "kafka"): "the telemetry's source (its Kafka topic or files), not a SUT's"}
BRANCH_DEBT: dict[str, int] = {}
"""Branches on a transport's name outside its own modules: none since 2026-12-01 (60 in 13 modules on 2026-11-30,
when issue 64 point 2 set the guard). A new branch fails the guard: what differs is a field of the descriptor."""


def name_branches(path: str, names: set[str]) -> list[tuple[int, str]]:
    """Where ``path`` compares something with a transport's name (``==``, ``!=``, ``in``, ``not in``) or keys a
    dict literal by one (a side table), outside the registries' own literals."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    registry = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.AnnAssign | ast.Assign)
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name) and t.id in REGISTRIES}

    def named(node) -> str | None:
        if isinstance(node, ast.Constant) and node.value in names:
            return node.value
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return next((e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names), None)
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            name = next(filter(None, map(named, [node.left, *node.comparators])), None)
        elif isinstance(node, ast.Dict) and id(node) not in registry:
            name = next(filter(None, map(named, [k for k in node.keys if k is not None])), None)
        else:
            continue
        if name is not None and (path, name) not in NOT_A_TRANSPORT:
            found.append((node.lineno, name))
    return found


def test_no_module_outside_a_transports_own_branches_on_its_name():
    """Every package of the product (scenarios/ and bench/ too), read with the AST: a comparison with a transport's
    name or scheme, or a dict keyed by one, outside that transport's own modules, is a branch a new transport would
    have to add to. The names and the own modules come from the registries; the branches still there are
    ``BRANCH_DEBT``, which may only shrink."""
    names, own = transport_names(), transport_modules()
    found: dict[str, list] = {}
    for package in sorted(d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.relpath(os.path.join(folder, name), ROOT)
                if path not in own and (hits := name_branches(path, names)):
                    found[path] = hits
    grew = {p: hits for p, hits in found.items() if len(hits) > BRANCH_DEBT.get(p, 0)}
    assert not grew, f"new branches on a transport's name (a field of its descriptor instead): {grew}"
    paid = {p: (n, len(found.get(p, []))) for p, n in BRANCH_DEBT.items() if len(found.get(p, [])) < n}
    assert not paid, f"branches taken away: lower BRANCH_DEBT to what is left (debt, now): {paid}"


def test_the_guard_finds_a_planted_branch_and_a_planted_side_table(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(scheme):\n    if scheme == "amqps":\n        return 1\n    return {"artemis": 2}\n'
                       'OK = {"telemetry-broker": 3}\n')
    assert name_branches(str(planted), transport_names()) == [(2, "amqps"), (4, "artemis")]


def test_every_transport_is_one_descriptor_and_its_schemes_and_receiver_mode_come_from_it():
    from agents.receiver import _parser
    from transports.registry import ALL, RECEIVERS

    folders = {d for d in os.listdir(os.path.join(ROOT, "transports"))
               if os.path.isfile(os.path.join(ROOT, "transports", d, "__init__.py"))}
    assert sorted(t.name for t in ALL) == sorted(folders), "a transport's package is registered, and only one's"
    assert len(RECEIVERS) == len(ALL) and {"http", "kafka", "amqp", "amqp1"} <= set(RECEIVERS)
    assert set(TRANSPORTS) == {s for t in ALL for s in t.target.SCHEMES}
    for t in ALL:
        assert t.receive.__module__ == f"transports.{t.name}.process", t
        assert t.receiver_module.__name__ == f"transports.{t.name}.receiver", t
        a = _parser().parse_args([t.receiver])
        assert (a.mode, a.agent) == (t.receiver, f"receiver-{t.receiver}")


@pytest.mark.parametrize("payload, refused", [(900, False), (2048, True)])
def test_an_amqp1_event_over_the_links_max_message_size_is_refused_before_the_attack(payload, refused):
    """A peer that gives the link a ``max-message-size`` of 1,500 bytes on attach: an event over it (as encoded,
    properties and all) is one ``ValueError`` at connect. The peer is proton's own container listening on loopback: a
    stand-in, since neither Artemis 2.40 nor RabbitMQ 3.10's plugin sets a limit on the link it attaches."""
    import asyncio
    import threading

    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    from core.procs import free_port, wait_port
    from transports.registry import TargetOptions, TargetSpec, make_target

    class Peer(MessagingHandler):
        def on_start(self, event):
            self.acceptor = event.container.listen(f"127.0.0.1:{port}")

        def on_link_opening(self, event):
            event.link.max_message_size = 1500
            event.link.target.copy(event.link.remote_target)
            event.link.source.copy(event.link.remote_source)

    port = free_port()
    peer = Container(Peer())
    thread = threading.Thread(target=peer.run, daemon=True)
    thread.start()
    try:
        assert wait_port(port, 10)
        target = make_target(TargetSpec.parse(f"amqp1://127.0.0.1:{port}/orders"), TargetOptions(5.0, 1, "r", payload))
        try:
            asyncio.run(target.connect())
            got = None
        except ValueError as e:
            got = str(e)
        finally:
            asyncio.run(target.close())
        assert (got is not None) == refused, got
        if refused:
            assert "over the broker's max-message-size for orders (1,500)" in got and "--payload" in got, got
    finally:
        peer.stop()
        thread.join(10)


def test_every_consumer_of_the_sut_keeps_the_receiver_source_contract():
    """The Kafka, AMQP 0-9-1 and AMQP 1.0 consumers each keep ``agents.source.Source`` (its attributes and
    ``counters()``, whose keys the agents' shared code reads), built here as their agents build them."""
    from agents.source import Source
    from transports.amqp import Amqp1Address, AmqpAddress
    from transports.amqp091.receiver import AmqpReceiver
    from transports.amqp1.receiver import Amqp1Receiver
    from transports.kafka.receiver import KafkaReceiver

    spool = type("Spool", (), {"append": staticmethod(lambda line: True),
                               "counters": staticmethod(lambda: {"spooled": 0, "lost": 0})})()
    address, params = AmqpAddress.from_url("amqp://guest:guest@127.0.0.1:1/%2F?queue=q")
    consumers = [Amqp1Receiver("127.0.0.1", 1, None, Amqp1Address("q"), spool, "a1"),
                 AmqpReceiver(params, address, spool, "a0"),
                 KafkaReceiver(None, spool, "t", os.path.join(tempfile.mkdtemp(), "state"), "k")]
    for consumer in consumers:
        assert isinstance(consumer, Source), type(consumer).__name__
        c = consumer.counters()
        assert {"agent", "received", "unattributed", "telemetry"} <= set(c), (type(consumer).__name__, c)
        assert (c["agent"], c["received"], c["unattributed"], c["telemetry"]) == (
            consumer.agent, 0, 0, {"spooled": 0, "lost": 0})


@pytest.mark.parametrize("event_id, payload_bytes, body_max, mode", [("loadgen-0-1", 2048, 131064, 1),
                                                                     ("x" * 255, 70_000, 4088, 2), ("é", 0, 4088, 1)])
def test_a_publish_is_the_frames_pika_itself_writes(event_id, payload_bytes, body_max, mode):
    """``PublishFrames`` against pika's own marshalling of the same ``basic.publish``: byte for byte, and as pika's
    frame decoder reads it back (the body split at the connection's frame size)."""
    import pika
    from pika import frame

    from transports.amqp091.target import PublishFrames

    payload, fixed, stamp = os.urandom(payload_bytes), {"cloudEvents_specversion": "1.0", "cloudEvents_fwrun": "r"}, \
        1_764_217_000_123_456_789
    ours = PublishFrames(3, "ex", "rk", payload, body_max, "application/octet-stream", fixed, "cloudEvents_id",
                         "fw_sent_ns", mode).frames(event_id, stamp)
    props = pika.BasicProperties(content_type="application/octet-stream", message_id=event_id, delivery_mode=mode,
                                 headers=dict(fixed, cloudEvents_id=event_id, fw_sent_ns=stamp))
    pikas = [frame.Method(3, pika.spec.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True)).marshal(),
             frame.Header(3, len(payload), props).marshal()]
    pikas += [frame.Body(3, payload[i:i + body_max]).marshal() for i in range(0, len(payload), body_max)]
    assert ours == b"".join(pikas)
    frames, rest = [], ours
    while rest:
        used, f = frame.decode_frame(rest)
        frames.append(f)
        rest = rest[used:]
    method, header, bodies = frames[0], frames[1], frames[2:]
    assert (method.method.exchange, method.method.routing_key, method.method.mandatory) == ("ex", "rk", True)
    assert header.body_size == payload_bytes and header.properties.message_id == event_id
    assert header.properties.headers == dict(fixed, cloudEvents_id=event_id, fw_sent_ns=stamp)
    assert b"".join(b.fragment for b in bodies) == payload and all(b.channel_number == 3 for b in frames)


def test_an_event_id_too_long_for_a_short_string_is_a_value_error():
    from transports.amqp091.target import PublishFrames

    frames = PublishFrames(1, "", "q", b"", 4088, "application/octet-stream", {}, "cloudEvents_id", "fw_sent_ns", 1)
    with pytest.raises(ValueError, match="255 bytes"):
        frames.frames("x" * 256, 1)


def test_publish_frames_of_many_routes_carry_each_events_routing_key():
    """The routing scenario's publisher: one method frame per routing key, made once; event k's frames carry key k's
    (as pika's decoder reads them), the rest of the frames unchanged."""
    from pika import frame

    from transports.amqp091.target import PublishFrames

    keys = [f"fw.{i}" for i in range(5)]
    frames = PublishFrames(1, "fw.topic", keys, b"p" * 10, 4088, "application/octet-stream", {}, "cloudEvents_id",
                           "fw_sent_ns", 1)
    for route in (0, 3, 4):
        raw = frames.frames("loadgen-8", 7, route)
        used, method = frame.decode_frame(raw)
        assert (method.method.exchange, method.method.routing_key) == ("fw.topic", f"fw.{route}")
        assert raw[used:] == frames.frames("loadgen-8", 7, 0)[len(frames._heads[0]):]


def test_a_kafka_send_carries_its_stamp_as_ce_time_across_a_second(monkeypatch):
    """Each Kafka record's ``ce_time`` is its send stamp in RFC 3339 to the µs (the date part is formatted once a
    second, the µs per event), its ``ce_id`` its key; the ack reaches the book with that stamp. A stub stands in
    for librdkafka's producer: only what ``send`` hands it is looked at."""
    from transports.base import TargetOptions
    from transports.kafka.target import KafkaTarget

    stamps = iter([1_795_858_628_999_999_123, 1_795_858_629_000_000_999, 1_795_858_629_000_500_000])
    monkeypatch.setattr("transports.kafka.target.time.time_ns", lambda: next(stamps))
    produced, booked = [], []
    target = KafkaTarget(TargetSpec.parse("kafka://127.0.0.1:9/t"), TargetOptions(run_id="r1", payload_bytes=4,
                                                                                  kafka_options={}))
    target.producer = type("P", (), {"produce": lambda self, *a, **k: produced.append((a, k))})()
    target.start(type("B", (), {"sent": lambda self, *a: booked.append(("sent", *a)),
                                "done": lambda self, *a: booked.append(("done", *a))})())
    for k in range(3):
        target.send(f"s-{k}", 100 + k)
    got = [(dict(k["headers"])["ce_time"], dict(k["headers"])["ce_id"], a[2]) for a, k in produced]
    assert got == [(b"2026-11-28T09:37:08.999999Z", b"s-0", b"s-0"), (b"2026-11-28T09:37:09.000000Z", b"s-1", b"s-1"),
                   (b"2026-11-28T09:37:09.000500Z", b"s-2", b"s-2")]
    produced[1][1]["on_delivery"](None, None)
    # the send is booked with its stamp and the partition it went to (its route: a(3) of produce)
    assert booked[1] == ("sent", "s-1", 101, 1_795_858_629_000_000_999, produced[1][0][3])
    assert booked[-1] == ("done", "s-1", 1_795_858_629_000_000_999, None, None)


def test_librdkafkas_lines_of_a_failed_kafka_connect_stay_unsaid_until_its_close():
    """A Kafka target whose connect fails says so in one line (``ConnectionError``); librdkafka's own lines of the
    failure, still queued, come out of the close's flush: the log stays quiet until then, and as it was after. (CI
    printed ``librdkafka: FAIL ... SSL handshake failed`` beside the one line when the level came back first.) Port 9
    (discard) has no Kafka broker: the connect's deadline ends it."""
    import asyncio
    import logging

    from transports.base import TargetOptions
    from transports.kafka.target import KafkaTarget

    log = logging.getLogger("librdkafka")
    target = KafkaTarget(TargetSpec.parse("kafka://127.0.0.1:9/t"), TargetOptions(timeout_s=0.5, run_id="r1",
                                                                                  payload_bytes=4, kafka_options={}))

    async def go() -> list:
        seen = []
        with pytest.raises(ConnectionError, match="is it up, and a Kafka broker"):
            await target.connect()
        seen.append(log.level)
        await target.close()
        seen.append(log.level)
        return seen

    before = log.level
    assert asyncio.run(go()) == [logging.CRITICAL + 1, before]


def test_a_sinks_stack_target_is_its_scheme_on_its_stack_port_and_no_other_transport_has_one(monkeypatch):
    """A scenario that attacks the stack's receiver (``target = http``) aims where the stack runs it: the descriptor's
    ``stack_port`` setting, which the stack's port table takes too (``stack.config.PORT_SETTINGS``)."""
    from stack.config import PORT_SETTINGS
    from transports.registry import ALL

    sinks = [t for t in ALL if t.sink]
    assert [t.name for t in sinks] == ["http"]
    monkeypatch.setenv("FLIGHTWATCH_RECEIVER_PORT", "18111")
    assert sinks[0].stack_target() == "http://127.0.0.1:18111/"
    assert PORT_SETTINGS["http-receiver"] == ("FLIGHTWATCH_RECEIVER_PORT", 18080)
    for t in ALL:
        if not t.sink:
            with pytest.raises(ValueError, match=f"transport {t.name} is no sink"):
                t.stack_target()

"""The AMQP 1.0 event codec against proton's own: what ``EventEncoder`` writes, ``proton.Message`` decodes to the
same event; what proton encodes, in every shape a broker or another client may hand over, ``read_event`` reads as
proton does."""
from __future__ import annotations

import os
import uuid

import pytest
from proton import Message

from transports.amqp1.codec import EventEncoder, read_event

ID, RUN = b"cloudEvents_id", b"cloudEvents_fwrun"
FIXED = {"cloudEvents_specversion": "1.0", "cloudEvents_source": "flightwatch/loadgen",
         "cloudEvents_type": "dev.flightwatch.load", "cloudEvents_fwrun": "run-1"}


@pytest.mark.parametrize("event_id, payload_bytes", [("s1-0", 0), ("s1-42", 2048), ("x" * 300, 100),
                                                     ("é-ü-" + "9" * 40, 70_000)])
def test_what_the_encoder_writes_proton_decodes_to_the_same_event(event_id, payload_bytes):
    payload = os.urandom(payload_bytes)
    enc = EventEncoder(FIXED, payload, "application/octet-stream", ID.decode(), "fw_sent_ns")
    stamp = 1_764_217_000_123_456_789
    m = Message()
    m.decode(enc.encode(event_id, stamp))
    assert m.id == event_id and m.content_type == "application/octet-stream" and m.body == payload
    assert m.properties == dict(FIXED, cloudEvents_id=event_id, fw_sent_ns=stamp)
    assert type(m.properties["fw_sent_ns"]) is int and not m.durable  # an AMQP long; no header: not durable
    assert read_event(enc.encode(event_id, stamp), ID, RUN) == (event_id, "run-1", payload_bytes)


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_event_carries_a_header_that_says_so(durable):
    enc = EventEncoder(FIXED, b"p", "application/octet-stream", ID.decode(), "fw_sent_ns", durable=durable)
    m = Message()
    m.decode(enc.encode("s1-1", 5))
    assert m.durable is durable and m.id == "s1-1" and m.body == b"p"
    assert read_event(enc.encode("s1-1", 5), ID, RUN) == ("s1-1", "run-1", 1)


@pytest.mark.parametrize("message_id, want", [(7, "7"), (uuid.UUID(int=5), str(uuid.UUID(int=5))), (b"bin", "bin"),
                                              ("text", "text"), (None, None)])
def test_the_message_id_stands_for_a_missing_event_id(message_id, want):
    m = Message(body=b"abc", properties={"cloudEvents_fwrun": "r", "other": [1, {"a": 2}]}, id=message_id)
    assert read_event(m.encode(), ID, RUN) == (want, "r", 3)


def test_every_section_proton_writes_is_stepped_over():
    """Header, delivery and message annotations, a footer, a big map: the reader steps over what it does not use."""
    m = Message(body=b"x" * 300, id="m", durable=True, priority=5, ttl=1000, first_acquirer=True, delivery_count=2,
                annotations={"x-opt-jms-dest": 1, "x-opt-big": "y" * 400}, instructions={"k": "v"},
                properties={"cloudEvents_id": "E", "cloudEvents_fwrun": "R", "many": list(range(300)),
                            "f": 1.5, "t": True, "n": None}, subject="s", reply_to="r", correlation_id=9)
    assert read_event(m.encode(), ID, RUN) == ("E", "R", 300)


@pytest.mark.parametrize("body, size", [("hello", 5), (b"hello", 5), ({"a": 1}, 14), ([1, 2], 13)])
def test_a_value_body_counts_its_bytes_or_its_encoding(body, size):
    """A binary or string value counts as its bytes (as ``len(message.body)``); a map or list as its encoding (proton
    writes them as map32 and list32)."""
    m = Message(body=body, properties={"cloudEvents_id": "E", "cloudEvents_fwrun": "R"})
    assert read_event(m.encode(), ID, RUN) == ("E", "R", size)


def test_keys_match_whole_not_as_a_prefix_and_values_are_not_keys():
    m = Message(body=b"", properties={"cloudEvents_idx": "no", "a": "cloudEvents_id", "cloudEvents_fwrun": "R"},
                id="m")
    assert read_event(m.encode(), ID, RUN) == ("m", "R", 0)


@pytest.mark.parametrize("raw", [b"\x01\x02", b"\x00\x53\x75\xb0\x00\x00\x10\x00abc", b"\x00\x53\x74\xc1\x05\x02",
                                 b"\x00\x53\x74\xc1\x03\x02\xa1\xff", bytes([0x00, 0x53, 0x73, 0x07])])
def test_bytes_that_are_no_message_are_a_value_error(raw):
    with pytest.raises(ValueError):
        read_event(raw, ID, RUN)


def test_a_truncated_event_is_a_value_error_at_every_cut_inside_a_section():
    enc = EventEncoder(FIXED, b"p" * 20, "application/octet-stream", ID.decode(), "fw_sent_ns")
    whole = enc.encode("s1-1", 1)
    boundaries = {whole.index(b"\x00\x53\x74"), whole.index(b"\x00\x53\x75")}  # whole sections: a shorter message
    assert read_event(whole[:min(boundaries)], ID, RUN) == ("s1-1", None, 0)
    for cut in set(range(1, len(whole))) - boundaries:
        with pytest.raises(ValueError):
            read_event(whole[:cut], ID, RUN)

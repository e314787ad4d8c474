"""pika, honestly: the AMQP 0-9-1 target writes through private parts of pika 1.4 (``transports.amqp.PIKA_PRIVATE``). A
pika without one of them is refused before any connection, in one line naming the part and the version flightwatch
is tested with, never booked as the SUT's error send after send."""
from __future__ import annotations

import asyncio
import re
import tomllib

import pika
import pytest
from support import ROOT

from transports import amqp


@pytest.fixture
def checked_again():
    amqp.require_pika_internals.cache_clear()
    yield
    amqp.require_pika_internals.cache_clear()


def test_the_installed_pika_is_the_pinned_one_and_has_every_private_part(checked_again):
    pins = tomllib.load(open(f"{ROOT}/pyproject.toml", "rb"))["project"]["dependencies"]
    assert f"pika=={amqp.PIKA_TESTED}" in pins and pika.__version__ == amqp.PIKA_TESTED
    amqp.require_pika_internals()


@pytest.mark.parametrize("module, cls, name", amqp.PIKA_PRIVATE, ids=[p[2] for p in amqp.PIKA_PRIVATE])
def test_a_pika_without_one_is_refused_before_any_connection_in_one_line(checked_again, monkeypatch, module, cls, name):
    import importlib
    import inspect

    klass = getattr(importlib.import_module(module), cls)
    if hasattr(klass, name):
        monkeypatch.delattr(klass, name)
    else:  # an attribute set on self: a pika whose source no longer sets it
        source = inspect.getsource(klass).replace(f"self.{name}", "self._renamed")
        monkeypatch.setattr(inspect, "getsource", lambda obj, _real=inspect.getsource: source if obj is klass else _real(obj))
    with pytest.raises(amqp.PikaMismatch) as e:
        amqp.require_pika_internals()
    assert re.fullmatch(rf"pika {re.escape(pika.__version__)} lacks {cls}\.{name}, which flightwatch's AMQP 0-9-1 "
                        rf"target writes through: flightwatch is tested with pika {amqp.PIKA_TESTED} .*", str(e.value))
    assert isinstance(e.value, ValueError)  # the load generator's check before the load: one line, exit 2
    # the target itself asks first: its connection is never opened
    from transports.registry import TargetOptions, TargetSpec, make_target

    target = make_target(TargetSpec.parse("amqp://guest:guest@127.0.0.1:1/%2F?queue=q"), TargetOptions(1.0, 1, "r", 10, {}))
    with pytest.raises(amqp.PikaMismatch):
        asyncio.run(target._open())
    assert target.conn is None

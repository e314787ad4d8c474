"""The routing scenario's arithmetic (``scenarios.routing``): the broker's CPU per message second by second from
sampled CPU and the run's windows, and the fitted growth per tenfold of bindings with its verdict, on synthetic
costs of known growth; and the address that routes event k to queue k mod N."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scenarios import routing
from transports import amqp

NS = 10**9


def test_cost_per_second_is_the_cpu_of_each_measured_window_over_its_messages():
    t0 = 1_800_000_000 * NS
    # CPU sampled every second at half-second offsets: 0.05 s of CPU a second, then 0.10 from the sixth second on
    samples = [(t0 + k * NS + NS // 2, 0.05 * min(k, 5) + 0.10 * max(k - 5, 0)) for k in range(12)]
    windows = pd.DataFrame({"window_ns": [t0 + k * NS for k in range(12)], "received": [500] * 11 + [0]})
    costs = routing.cost_per_second(samples, windows, (t0 + 2 * NS, t0 + 10 * NS))
    # windows 2..9 lie in the span and between samples; window 5 straddles the change (half of each)
    assert costs == pytest.approx([100, 100, 100, 150, 200, 200, 200, 200])


@pytest.mark.parametrize("growth, verdict", [(0.0, "flat"), (0.5, "grows")])
def test_the_slope_finds_the_growth_it_was_given(growth, verdict):
    rng = np.random.default_rng(1)
    sizes = [1, 10, 100, 1000]
    costs = [50 * (1 + growth) ** np.log10(b) * rng.lognormal(0, 0.05, 30) for b in sizes]
    s = routing.slope(sizes, costs)
    assert s["verdict"] == verdict and s["ci_low"] < growth < s["ci_high"] and s["ci_high"] - s["ci_low"] < 0.1
    assert s["growth_per_decade"] == pytest.approx(growth, abs=0.03)
    assert routing.verdict_text(s).startswith(f"{verdict}: the broker's CPU per message {s['growth_per_decade']:+.1%}")


def test_noise_too_wide_to_call_is_undecided_and_one_size_is_not_a_slope():
    rng = np.random.default_rng(2)
    sizes = [1, 10, 100]
    s = routing.slope(sizes, [50 * rng.lognormal(0, 0.8, 4) for _ in sizes])
    assert s["verdict"] == "undecided" and s["ci_high"] - s["ci_low"] > 0.2
    assert routing.slope([10], [np.array([5.0, 6.0])])["verdict"] == "undecided"


def test_an_address_with_bindings_routes_event_k_to_the_queue_of_key_k_mod_n():
    a = amqp.AmqpAddress.parse("/%2F", "exchange=fw.topic&bindings=3")
    assert (a.exchange, a.bindings, a.routing_key) == ("fw.topic", 3, "fw")
    assert a.routes() == [("fw.topic.q0", "fw.0"), ("fw.topic.q1", "fw.1"), ("fw.topic.q2", "fw.2")]
    assert "topic exchange fw.topic, 3 queues" in a.where()
    assert amqp.AmqpAddress.parse("/%2F", "queue=q").bindings == 0
    for query, words in (("queue=q&bindings=3", "needs ?exchange=NAME"), ("exchange=x&bindings=0", "N >= 1"),
                         ("exchange=x&bindings=lots", "a number of queues")):
        with pytest.raises(ValueError) as e:
            amqp.AmqpAddress.parse("/%2F", query)
        assert words in str(e.value)

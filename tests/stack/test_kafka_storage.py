"""The Apache Kafka node's cluster ID is one ``kafka-storage format`` takes: a leading ``-`` (one draw in 64 of
URL-safe base64) was read as an option and failed a scenario's renewal in CI (stop 57)."""
from __future__ import annotations

import base64

from stack.kafka import random_uuid


def test_a_cluster_id_is_sixteen_bytes_and_never_starts_with_a_dash():
    ids = [random_uuid() for _ in range(4000)]  # without the redraw, P(no leading '-') = (63/64)^4000 < 1e-27
    assert not [i for i in ids if i.startswith("-")]
    assert {len(base64.urlsafe_b64decode(i + "==")) for i in ids} == {16} and len(set(ids)) == len(ids)

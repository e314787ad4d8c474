"""Where an event arrived against where it was sent: a join partition's misrouting rules (``streaming.rules`` applies
them in ``take_receives``).

A send names its route when its target is several places the load generator chose among (pair k of ``?pairs=N``,
the queue bound with route k's key of ``?bindings=N``); a receive names the route of the place it arrived at
(``core.contract.Receive``). An event whose first receive is on another route is misrouted: its own bucket of the
ledger, counted by its receive window, never an on-time receive; a later receive of it is a duplicate. A send or a
receive naming no route (an HTTP target, a single queue) is never misrouted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core import output
from streaming import partials
from streaming.state import NO_ROUTE


def misrouted(send_routes: np.ndarray | None, pos: np.ndarray, recv_routes: np.ndarray, decide: np.ndarray) -> np.ndarray:
    """Of the receives (at rows ``pos`` of the known sends, whose routes are ``send_routes``), those that decide their
    event (``decide``) and arrived on a route other than the one it was sent to."""
    mis = np.zeros(len(pos), dtype=bool)
    if send_routes is None or not decide.any():
        return mis
    sent = np.full(len(pos), NO_ROUTE, np.int64)
    sent[decide] = send_routes[pos[decide]]
    return decide & (sent != NO_ROUTE) & (recv_routes != NO_ROUTE) & (sent != recv_routes)


def take(known, p: np.ndarray, at: np.ndarray, ids: np.ndarray, routes: np.ndarray, dropped: np.ndarray,
         unaccounted: np.ndarray, drops_named_ns: int, out: partials.Collector) -> pd.DataFrame:
    """Misrouted first receives at rows ``p`` of ``known`` (a ``rules.Known``): counted at their receive; a drop
    (``dropped``, a mask of ``p``) or an unaccounted (``unaccounted``) declared already is withdrawn; one that failed
    at the sender is also counted apart (the ledger's ``failed`` leaves it out). The exemplar rows: ``misrouted_id``
    (``value``: the route it arrived on) and the withdrawn drops' names."""
    if not len(p):
        return pd.DataFrame()
    sent_ns = known.sent_ns
    out.add(output.MISROUTED, at)
    out.add(output.FAILED_MISROUTED, sent_ns[p[known.errored[p]]])
    out.add(output.DROPPED, sent_ns[p[dropped]], -1)
    out.add(output.UNACCOUNTED, sent_ns[p[unaccounted]], -1)
    return pd.concat([partials.misrouted(at, ids, routes), known.unname(p[dropped], drops_named_ns)], ignore_index=True)

"""A disk spool between a hot agent and the telemetry broker, and the process that ships it.

The HTTP receiver must answer thousands of requests a second on one core; a Kafka client
in the same process costs it CPU on its one core, and a broker that is away must never hold
up an answer. So the receiver only
*appends* each receive line to a spool file (a copy into a file mapped in memory,
no system call) **before it answers 202**, and a separate shipper process tails the spool into
the telemetry topic:

    receiver ──append──▶ <spool>/000000000001.ndjson ──tail──▶ shipper ──▶ telemetry topic
                          <spool>/shipped  (segment, byte offset acknowledged by the broker)

Guarantees: a receive answered 202 is in the spool (the OS page cache: it survives a kill -9
of either process, not a power loss). The shipper commits its position only after the
broker acknowledged everything before it; after a crash it re-sends from the committed
position, i.e. identical records the streaming job recognises as repeats. Nothing is lost
and nothing counted twice.

Budget: segments rotate at ``segment_bytes``; acknowledged segments are deleted. While
the spool holds more than ``budget_bytes`` (the broker has been away for long), new lines
are refused and counted as lost (``num_lost``), never silently.

    python -m agents.shipper ship --spool-dir DIR --agent NAME [--bootstrap 127.0.0.1:19092]   (agents.shipper)
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import time

from core.held import HELD_S, held_record

SEGMENT_BYTES = 64 << 20
BUDGET_BYTES = 2 << 30
"""Disk the spool may hold while the broker is away: ~14M receive records."""
SUFFIX = ".ndjson"
MAPPED_BYTES = 4 << 20
"""How much of the segment's written part the writer keeps mapped: the rest is handed back (``MADV_DONTNEED``; the
lines stay in the file and the page cache). Without it the receiver's resident memory grew with its segment, by up
to 64 MiB (+38 MiB over a day of 360,000 receives), all of it file pages no one in it reads again."""
SHIPPER_NICE = 10
"""The shipper lowers its CPU priority by this: catching up after a telemetry outage never takes CPU from the
receiver that stamps the receive times."""
DRAIN_WAIT_S = 90
"""A receiver that stops waits this long for its shipper to drain the spool (a send's wait of 30 s, the final flush
of 10 s, and a backlog's catching up); in a pod the grace period must be longer, or the kubelet kills the shipper
with unshipped receive records in an emptyDir that goes with the pod."""


def _segments(spool_dir: str) -> list[int]:
    return sorted(int(n[:-len(SUFFIX)]) for n in os.listdir(spool_dir) if n.endswith(SUFFIX) and n[:-len(SUFFIX)].isdigit())


def _segment_path(spool_dir: str, seq: int) -> str:
    return os.path.join(spool_dir, f"{seq:012d}{SUFFIX}")


def spool_bytes(spool_dir: str) -> int:
    """Disk the spool's segments take (blocks in use: the unwritten part of a segment is sparse)."""
    total = 0
    for seq in _segments(spool_dir):
        try:
            total += os.stat(_segment_path(spool_dir, seq)).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


class SpoolWriter:
    """Appends lines to the newest segment, a file mapped into memory (``MAP_SHARED``).

    An append is a copy into the page cache, no system call: the line is in the file, for
    the shipper to read and for any later process, as soon as ``append`` returns. A segment
    is created at its full size (sparse) and cut to what it holds when the writer moves on;
    readers stop at the first NUL byte (the unwritten part). Whole pages written more than
    ``MAPPED_BYTES`` ago are unmapped from the writer (one ``madvise`` each ``MAPPED_BYTES``).
    """

    def __init__(self, spool_dir: str, segment_bytes: int = SEGMENT_BYTES, budget_bytes: int = BUDGET_BYTES,
                 agent: str | None = None) -> None:
        self.dir = spool_dir
        os.makedirs(spool_dir, exist_ok=True)
        # a segment is at most an eighth of the budget, so the budget is checked often enough to hold
        self.segment_bytes = max(min(segment_bytes, budget_bytes // 8), 64 << 10)
        self.budget_bytes = budget_bytes
        self.agent = agent or os.path.basename(os.path.normpath(spool_dir))
        self._lost_reported = 0
        self._next_lost_report = 0.0
        existing = _segments(spool_dir)
        self.seq = existing[-1] if existing else 0  # always a fresh segment: never append after a torn line
        self.num_written = 0
        self.num_lost = 0
        self._over_budget = False
        self._next_check = 0
        self.mm = None
        self._open_next()

    def _open_next(self) -> None:
        self.seq += 1
        fd = os.open(_segment_path(self.dir, self.seq), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.segment_bytes)
            self.mm = mmap.mmap(fd, self.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.pos = self.released = 0

    def append(self, line: str) -> bool:
        if self._over_budget:
            self._next_check -= 1
            if self._next_check > 0 or self._check_budget():
                return self._lose()
        data = (line + "\n").encode()
        if self.pos + len(data) > self.segment_bytes:
            self._rotate()
            if self._over_budget:
                return self._lose()
        self._put(data)
        self.num_written += 1
        return True

    def _put(self, data: bytes) -> None:
        end = self.pos + len(data)
        if end > self.segment_bytes:
            self._rotate()
            end = len(data)
        self.mm[self.pos:end] = data
        self.pos = end
        if end - self.released >= 2 * MAPPED_BYTES:  # hand back what was written before the last MAPPED_BYTES
            upto = (end - MAPPED_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE
            self.mm.madvise(mmap.MADV_DONTNEED, self.released, upto - self.released)
            self.released = upto

    def _lose(self) -> bool:
        self.num_lost += 1
        if time.monotonic() >= self._next_lost_report:
            self.report_lost()
        return False

    def report_lost(self) -> None:
        """Spool a ``lost`` record for the lines refused since the last one (a few bytes, over budget
        or not), at most once a second: the run's summary shows them, nothing is lost silently."""
        from core import contract

        delta = self.num_lost - self._lost_reported
        if delta <= 0:
            return
        rec = contract.TelemetryLost(contract.ANY_RUN, self.agent, time.time_ns(), count=delta,
                                     reason=f"spool over its budget of {self.budget_bytes:,} bytes")
        self._put((contract.encode([rec]).decode().rstrip("\n") + "\n").encode())
        self._lost_reported = self.num_lost
        self._next_lost_report = time.monotonic() + 1.0

    def _check_budget(self) -> bool:
        """True while over budget (re-checked every 1,000 refused lines)."""
        self._over_budget = spool_bytes(self.dir) >= self.budget_bytes
        self._next_check = 1000
        return self._over_budget

    def _close_segment(self) -> None:
        self.mm.close()
        os.truncate(_segment_path(self.dir, self.seq), self.pos)

    def _rotate(self) -> None:
        self._close_segment()
        self._open_next()
        self._check_budget()

    def counters(self) -> dict:
        return {"spooled": self.num_written, "lost": self.num_lost, "over_budget": self._over_budget}

    def close(self) -> None:
        self._close_segment()


PROBE_BYTES = 64 << 10
"""What the shipper reads first past its position; more only if that is all written lines."""


class Shipper:
    """Tails a spool into a Kafka topic; commits its position after the broker's acknowledgement."""

    def __init__(self, spool_dir: str, producer, topic, key: str, lines_per_message: int = 1000,
                 read_bytes: int = 4 << 20, log=print) -> None:
        """``topic``: a topic's name, or a ``core.slices.TelemetryTopic`` (asked for the topic of each send)."""
        self.dir, self.producer, self.topic, self.key = spool_dir, producer, str(topic), key.encode()
        self._topic_now = topic if callable(topic) else (lambda: self.topic)
        self._forget = getattr(topic, "forget", None)  # a slice a send failed on is made sure of again
        self.lines_per_message, self.read_bytes, self.log = lines_per_message, read_bytes, log
        self.position_file = os.path.join(spool_dir, "shipped")
        self.seq, self.offset = self._load_position()
        self.num_shipped = 0
        self.num_failures = 0
        self.shared = None  # core.metrics.Shared: the receiver's /metrics shows this shipper's counters
        self.backlog = False
        self.first_try_ns: int | None = None  # when the lines being shipped were first sent (until acknowledged)
        self.hold: tuple[int, int] | None = None  # (began, lines shipped since) while a hold's backlog drains
        self.connected = False  # a first send acknowledged: a wait before it is the connection's set-up
        self.num_held = 0  # lines shipped from a hold's start until the spool caught up (core.held)

    def _load_position(self) -> tuple[int, int]:
        try:
            with open(self.position_file) as f:
                p = json.load(f)
            return int(p["segment"]), int(p["offset"])
        except (OSError, ValueError, KeyError):
            segs = _segments(self.dir)
            return (segs[0] if segs else 1), 0

    def _commit(self) -> None:
        tmp = self.position_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"segment": self.seq, "offset": self.offset}, f)
        os.replace(tmp, self.position_file)

    def _send(self, lines: list[bytes]) -> None:
        """Send and wait for the broker's acknowledgement of every message; raises on failure."""
        from core.kafka_options import produce

        topic = self._topic_now()
        failed: list = []

        def report(err, _msg) -> None:
            if err is not None:
                failed.append(err)
        try:
            for i in range(0, len(lines), self.lines_per_message):
                produce(self.producer, topic, b"\n".join(lines[i:i + self.lines_per_message]), self.key, on_delivery=report)
            if self.producer.flush(30):
                raise TimeoutError("telemetry broker did not acknowledge within 30 s")
            if failed:
                raise RuntimeError(failed[0].str())
        except Exception:
            if self._forget is not None:
                self._forget(topic)
            raise

    def ship_once(self) -> int:
        """Ship what the spool holds past the committed position (up to ``read_bytes``); lines shipped."""
        path = _segment_path(self.dir, self.seq)
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                # a first look, then the rest: a caught-up shipper read 4 MiB of the segment's unwritten
                # zeros 20 times a second (0.06 core at idle)
                data = f.read(PROBE_BYTES)
                if len(data) == PROBE_BYTES and b"\0" not in data:
                    data += f.read(self.read_bytes - PROBE_BYTES)
        except FileNotFoundError:
            data = b""
        nul = data.find(b"\0")
        if nul >= 0:  # the segment's unwritten part
            data = data[:nul]
        end = data.rfind(b"\n") + 1
        self.backlog = len(data) == self.read_bytes
        if end == 0:
            self._report_held(0)  # caught up after a hold
            # Nothing complete past the position. Once the writer has moved on to a later
            # segment this one is finished (what is left is a line torn by a crash): next.
            later = [s for s in _segments(self.dir) if s > self.seq]
            if later:
                if os.path.exists(path):
                    os.remove(path)
                self.seq, self.offset = later[0], 0
                self._commit()
            return 0
        lines = [ln for ln in data[:end].split(b"\n") if ln]
        self.first_try_ns = self.first_try_ns or time.time_ns()
        self._send(lines)
        self.offset += end
        self._commit()
        self.num_shipped += len(lines)
        self._report_held(len(lines))
        return len(lines)

    def _report_held(self, num_lines: int) -> None:
        """Lines acknowledged ``core.held.HELD_S`` or more after their first sending begin a hold; it lasts until the
        spool caught up with what it took meanwhile, and is then said (a held record), for the run's verdict."""
        began, self.first_try_ns = self.first_try_ns, None
        if self.hold is None:  # the lines spooled while these waited are shipped next: said once they are
            if began is None:  # nothing was sent
                return
            connected, self.connected = self.connected, True
            if connected and time.time_ns() - began >= HELD_S * 1e9:
                self.hold = (began, num_lines)
            return
        self.hold = (self.hold[0], self.hold[1] + num_lines)
        if self.backlog:
            return
        (began, count), self.hold = self.hold, None
        if (line := held_record(self.key.decode(), began, count)) is not None:
            self.num_held += count
            with contextlib.suppress(Exception):  # the broker away again: the lines are shipped, the note is not
                self._send([line])

    def collect(self):
        from core.metrics import family

        agent = self.key.decode()
        yield family("counter", "flightwatch_shipper_records", "receive records shipped into the telemetry topic",
                     ["agent"], [((agent,), self.num_shipped)])
        yield family("counter", "flightwatch_shipper_held_records", "receive records the telemetry broker acknowledged "
                     "a second or more after they were first sent (a hold, said in a held record)", ["agent"],
                     [((agent,), self.num_held)])
        yield family("counter", "flightwatch_shipper_failures", "shipping attempts the telemetry broker did not "
                     "acknowledge (retried)", ["agent"], [((agent,), self.num_failures)])
        yield family("gauge", "flightwatch_shipper_backlog_bytes", "disk the spool takes (segments not yet wholly shipped)", ["agent"],
                     [((agent,), spool_bytes(self.dir))])

    def run(self, should_stop, idle_s: float = 0.05, quiet_s: float = 0.25) -> None:
        """Ship until ``should_stop()`` and the spool is drained; back off and retry while the broker fails.

        Caught up, it ships every ``idle_s``: one request per interval, not one per few lines. With nothing to ship
        for a second it looks every ``quiet_s`` instead, until lines come again: an idle stack's two shippers woke
        40 times a second for nothing (0.007 core each)."""
        backoff = 0.1
        last_log = last_share = 0.0
        last_lines = time.monotonic()
        while True:
            if self.shared is not None and time.monotonic() - last_share >= 1.0:
                self.shared.sync(self.collect())
                last_share = time.monotonic()
            try:
                n = self.ship_once()
                backoff = 0.1
            except Exception as e:  # noqa: BLE001 - broker away or refusing: keep the spool, retry
                self.num_failures += 1
                if should_stop():  # the spool stays on disk for the next shipper
                    self.log(f"shipper {self.key.decode()}: stopping with {spool_bytes(self.dir):,} bytes unshipped "
                             "(kept in the spool)", flush=True)
                    return
                if time.monotonic() - last_log > 10:
                    self.log(f"shipper {self.key.decode()}: telemetry broker not acknowledging ({e}); "
                             f"{spool_bytes(self.dir):,} bytes spooled, retrying", flush=True)
                    last_log = time.monotonic()
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if n == 0 and should_stop():
                return
            if n:
                last_lines = time.monotonic()
            if not self.backlog:  # caught up: let lines gather (one request per interval, not one per few lines)
                time.sleep(quiet_s if time.monotonic() - last_lines > 1.0 else idle_s)

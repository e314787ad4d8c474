"""One receiver process, whatever its transport (``python -m agents.receiver MODE``): the telemetry spool and the
shipper that takes it to the telemetry topic, /metrics with the shipper's counters, the duties between the source's
turns, and the shutdown. A transport's source (``agents.source``) brings only how it receives: stamp, take, record,
ack, and its counters and progress line.

    process = Process(a, agent, spool_dir, budget_bytes, shipper_log, log, warn)   # the spool (None: no telemetry)
    process.start(source, listen)     # the shipper, /metrics (the source's families and the shipper's), the duties
    process.run_blocking(turn)        # a source with a loop of its own: turn() for at most ~0.1-1 s, then the duties
    process.run_async(body)           # an asyncio source: await body(stop) on uvloop, the duties as tasks
    process.close()                   # /metrics down, the spool closed; the shipper drains it, then exits

The duties: once a second the spool's refused lines reported and the metrics shared with the shipper's process; a
clock record every ``clock.REPORT_EVERY_S`` (with a spool); a progress line every 10 s while it receives (every 10
minutes at idle: ``logs.Progress``); the allocator trimmed every ``memory.trim_interval_s()``.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

from agents.duties import clock_every
from core import clock, contract, logs, memory, metrics

SECOND_S, PROGRESS_S = 1.0, 10.0


class Process:
    """A receiver process's parts besides its source."""

    def __init__(self, a, agent: str, spool_dir: str | None, budget_bytes: int, shipper_log: str, log, warn,
                 metrics_dir: str | None = None) -> None:
        """``a``: the agent's flags (``telemetry_bootstrap``, ``telemetry_topic``, ``clock_reference``);
        ``metrics_dir``: where this process's and its shipper's metric files meet (cleared), unless the caller set it
        for several processes (the HTTP sink's workers)."""
        from agents.spool import SpoolWriter

        if metrics_dir is not None:
            metrics.use_shared_dir(metrics_dir, clear=True)
        self.a, self.agent, self.log, self.warn, self.shipper_log = a, agent, log, warn, shipper_log
        self.spool = None if spool_dir is None else SpoolWriter(spool_dir, budget_bytes=budget_bytes, agent=agent)
        self.shared = metrics.Shared()
        self.shipper = self.server = self.source = None
        self.own = lambda: iter(())
        self._say = logs.Progress(lambda line: log(line, flush=True))
        self._tasks: list[asyncio.Task] = []
        now = time.monotonic()
        self._last = {"second": now, "clock": -float("inf"), "progress": now, "trim": now}

    @classmethod
    def in_state_dir(cls, a, budget_bytes: int) -> Process:
        """The process of a receiver whose flags give its ``--state-dir`` and ``--agent``: its log set up, its spool,
        shipper log and metrics under the folder (``state_paths``); its ``log`` and ``warn`` for the source."""
        logger = logs.setup(a.agent)
        spool_dir, shipper_log, metrics_dir = state_paths(a.state_dir, a.agent)
        return cls(a, a.agent, spool_dir, budget_bytes, shipper_log, logs.printer(logger),
                   logs.printer(logger, logs.WARNING), metrics_dir=metrics_dir)

    def start(self, source, listen: str | None = None) -> None:
        """Once the source is connected: the shipper, /metrics on ``listen`` (None: the source serves them itself;
        ``collect``), and on a running asyncio loop the duties' tasks."""
        from agents.shipper import start_shipper

        self.source, self.own = source, source.collect
        if self.spool is not None and self.shipper is None:
            self.shipper = start_shipper(self.spool.dir, self.a.telemetry_bootstrap, self.a.telemetry_topic,
                                         self.agent, log_path=self.shipper_log)
        if listen is not None:
            self.server = metrics.serve(self, listen, log=self.log)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._tasks = [asyncio.ensure_future(d) for d in self._async_duties()]

    def collect(self):
        """What a scrape of the process shows: the source's own families (read at scrape time) with those of its
        shipper and, for the HTTP sink's workers, the other workers (``core.metrics.Shared``)."""
        return self.shared.collect(self.own())

    def every_second(self) -> None:
        if self.spool is not None:
            self.spool.report_lost()  # the last refused lines too, once nothing more arrives
        self.shared.sync(self.own())

    def progress(self) -> None:
        self._say(*self.source.progress())

    def clock_record(self) -> None:
        """A clock record into the spool, on the thread that appends receives (the spool is not thread-safe)."""
        clock.report(lambda rec: self.spool.append(contract.encode([rec]).decode().rstrip("\n")), self.agent,
                     self.a.clock_reference, self.warn)

    def tick(self) -> None:
        """The duties that are due, for a source that runs a loop of its own and calls this between its turns."""
        now, last = time.monotonic(), self._last
        if now - last["second"] >= SECOND_S:  # once a second, not per batch
            self.every_second()
            last["second"] = now
        if self.spool is not None and now - last["clock"] >= clock.REPORT_EVERY_S:
            self.clock_record()
            last["clock"] = now
        if now - last["progress"] >= PROGRESS_S:
            self.progress()
            last["progress"] = now
        if now - last["trim"] >= memory.trim_interval_s():
            memory.trim(collect=True)
            last["trim"] = now

    def _async_duties(self):
        async def every(seconds: float, duty) -> None:
            while True:
                await asyncio.sleep(seconds)
                duty()

        duties = [every(SECOND_S, self.every_second), every(PROGRESS_S, self.progress), memory.trim_every()]
        if self.spool is not None:
            duties.append(clock_every(self.spool, self.agent, self.a.clock_reference, self.warn))
        return duties

    def run_blocking(self, turn) -> None:
        """``turn()`` and the due duties, until SIGTERM or Ctrl-C."""
        stopping: list[int] = []
        before = signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        try:
            while not stopping:
                turn()
                self.tick()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, before)

    def run_async(self, body) -> int:
        """``await body(stop)`` on uvloop (asyncio without it), SIGTERM and SIGINT setting ``stop``; its exit code."""
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass

        async def main() -> int:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            try:
                return await body(stop)
            finally:
                for t in self._tasks:
                    t.cancel()

        return asyncio.run(main())

    def close(self) -> None:
        """/metrics down and this process's gauges gone, the spool closed; the shipper drains it, then exits."""
        from agents.shipper import stop_shipper

        metrics.stop(self.server)
        self.shared.close()
        if self.spool is not None:
            self.spool.report_lost()
            self.spool.close()
        if self.shipper is not None:
            stop_shipper(self.shipper)


def state_paths(state_dir: str, agent: str) -> tuple[str, str, str]:
    """A Kafka or AMQP receiver's spool folder, shipper log and metrics folder under its ``--state-dir``."""
    return (os.path.join(state_dir, "spool"), os.path.join(state_dir, "shipper.log"),
            os.path.join(state_dir, f"{agent}.metrics"))

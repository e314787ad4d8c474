"""A TCP proxy on loopback that can take a server away and bring it back (fault tests), or put TLS
in front of it (security tests).

    proxy = FaultProxy(listen_port, target_port).start()
    proxy.cut()       # every connection reset, new ones refused: to clients, the server is down
    proxy.restore()   # listening again; the server behind it kept its state
    proxy.mute()      # the server's replies swallowed (what clients send still reaches it), until cut

The telemetry broker advertises the proxy's port, so every client (bootstrap and data
connections alike) goes through it. Runs an asyncio loop on a thread of its own.
"""
from __future__ import annotations

import asyncio
import threading

HOST = "127.0.0.1"


class FaultProxy:
    def __init__(self, listen_port: int, target_port: int, ssl_context=None) -> None:
        """``ssl_context``: terminate TLS here (clients must speak TLS; the server behind it does not)."""
        self.listen_port, self.target_port, self.ssl_context = listen_port, target_port, ssl_context
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.num_connections = 0
        self.num_cut = 0
        self.muted = False

    def start(self) -> FaultProxy:
        threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True).start()
        self._call(self._listen())
        return self

    def _call(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, HOST, self.listen_port, reuse_address=True,
                                                  ssl=self.ssl_context)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.num_connections += 1
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while data := await src.read(1 << 16):
                    if replies and self.muted:
                        continue
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.transport.abort()
                self._writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    async def _cut(self) -> None:
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()  # RST: the client sees the connection drop at once
        self._writers.clear()
        await self._server.wait_closed()
        self.num_cut += 1

    def cut(self) -> None:
        self._call(self._cut())
        self.muted = False

    def mute(self) -> None:
        """The server's replies are swallowed from now on (a connection that hangs one way), until ``cut``."""
        self.muted = True

    def restore(self) -> None:
        self._call(self._listen())

    def stop(self) -> None:
        try:
            self._call(self._cut())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

"""A TCP relay in front of PostgreSQL or Redis that a test can cut and restore.

The platform's processes connect through the relay instead of to the server. ``cut()`` resets every
open connection and answers new ones with an immediate close, which is what a client sees when the
server is down; ``restore()`` relays again. The real servers are never touched, so other users of
them (other test runs, a developer's shell) are unaffected.
"""

from __future__ import annotations

import asyncio
import socket
import threading


class TcpRelay:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0
        self.cut_active = False
        self.connections_total = 0
        self.refused_while_cut = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"relay-{target_port}", daemon=True)
        self._ready = threading.Event()

    def start(self) -> TcpRelay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=5)
        return self

    def url_for(self, url: str) -> str:
        """Rewrite a service URL's host:port to go through this relay."""
        host_port = f"{self.target[0]}:{self.target[1]}"
        if host_port not in url:
            raise ValueError(f"{url} does not point at {host_port}")
        return url.replace(host_port, f"{self.listen_host}:{self.port}")

    def cut(self) -> None:
        self._call(self._cut)

    def restore(self) -> None:
        self.cut_active = False

    def close(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> TcpRelay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inside the relay's event loop -------------------------------------------------------------
    def _call(self, fn) -> None:
        async def run():
            fn()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=5)

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def _cut(self) -> None:
        self.cut_active = True
        for writer in list(self._writers):
            self._reset(writer)
        self._writers.clear()

    async def _shutdown(self) -> None:
        self._cut()
        self._server.close()
        tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _reset(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:  # RST rather than FIN: what a crashed server's host sends
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
        writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        if self.cut_active:
            self.refused_while_cut += 1
            self._reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._reset(writer)
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(65536):
                    if self.cut_active:
                        break
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError, asyncio.CancelledError):
                pass
            finally:
                self._writers.discard(dst)
                self._reset(dst)

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass

"""The proxy's scrape client over real sockets: one kept-alive connection per replica, bodies by Content-Length or
chunked, a replica that closes or hangs or answers garbage (gateway/proxy/scrape_client.py)."""

import asyncio

import httpx
import pytest

from gateway.metrics_scraper import MetricsScraper
from gateway.proxy.scrape_client import KeepAliveScrapeClient
from tests.routing.vllm_metrics import vllm_metrics_body

BODY = vllm_metrics_body(running=(3,), waiting=(2,)).encode()


class Replica:
    """An HTTP/1.1 server that counts connections and requests and answers each GET as ``mode`` says."""

    def __init__(self, mode: str = "length") -> None:
        self.mode, self.connections, self.requests = mode, 0, 0
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/metrics"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (head := await reader.readuntil(b"\r\n\r\n")) and head.startswith(b"GET /metrics HTTP/1.1"):
                self.requests += 1
                writer.write(self._answer())
                await writer.drain()
                if self.mode == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self) -> bytes:
        if self.mode == "hang":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nvllm:"  # and nothing more
        if self.mode == "garbage":
            return b"<html>not http</html>\r\n\r\n"
        if self.mode == "chunked":
            half = len(BODY) // 2
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (BODY[:half], BODY[half:]))
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        close = b"Connection: close\r\n" if self.mode == "close" else b""
        return b"HTTP/1.1 200 OK\r\n" + close + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY


def scrapes(replica: Replica, n: int) -> list:
    """``n`` scrapes of ``replica`` one after another through one client."""

    async def run():
        client = KeepAliveScrapeClient()
        async with replica as url:
            answers = [await client.get(url, timeout=1.0) for _ in range(n)]
            await client.aclose()
        return answers

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["length", "chunked"])
def test_scrapes_share_one_kept_alive_connection(mode):
    replica = Replica(mode)
    answers = scrapes(replica, 5)
    assert [a.status_code for a in answers] == [200] * 5 and {a.content for a in answers} == {BODY}
    assert (replica.connections, replica.requests) == (1, 5)


def test_a_replica_that_closes_gets_a_new_connection_each_time():
    replica = Replica("close")
    assert [a.content for a in scrapes(replica, 3)] == [BODY] * 3
    assert (replica.connections, replica.requests) == (3, 3)


@pytest.mark.parametrize("mode", ["hang", "garbage"])
def test_a_hung_or_garbled_answer_is_an_error_and_its_connection_is_not_reused(mode):
    replica = Replica(mode)

    async def run():
        client = KeepAliveScrapeClient()
        async with replica as url:
            for _ in range(2):
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(httpx.HTTPError):
                    await client.get(url, timeout=0.3)
                assert loop.time() - started < 1.0, "bounded by the timeout"
            await client.aclose()

    asyncio.run(run())
    assert replica.connections == 2, "each failed answer's connection was closed, not read again"


def test_the_scraper_reads_replicas_through_it_and_drops_connections_to_replicas_it_no_longer_scrapes():
    replicas = [Replica(), Replica()]

    async def run():
        client = KeepAliveScrapeClient()
        scraper = MetricsScraper(client=client)
        async with replicas[0] as first, replicas[1] as second:
            scraper.set_targets({"a": first.removesuffix("/metrics"), "b": second.removesuffix("/metrics")})
            await scraper.scrape_all()
            await scraper.scrape_all()
            assert scraper.latest("a").num_running == 3 and scraper.latest("b").num_waiting == 2
            assert len(client._idle) == 2
            scraper.set_targets({"a": first.removesuffix("/metrics")})
            assert len(client._idle) == 1, "b's connection closed with its target"
            await client.aclose()

    asyncio.run(run())
    assert [(r.connections, r.requests) for r in replicas] == [(1, 2), (1, 2)]

"""The proxy's client to the replicas keeps no cookies: one that an answer set would otherwise ride on every later
request to that replica, whoever sent it."""

from aiohttp import web

from gateway.proxy.state import upstream_session


async def test_a_cookie_a_replica_sets_is_never_sent_back():
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.Response(text="ok")
        response.set_cookie("session", "tenant-a-secret")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    session = upstream_session()
    try:
        for _ in range(2):
            async with session.post(f"http://localhost:{port}/v1/completions", data=b"{}") as response:
                assert response.status == 200 and "session" in response.cookies
        assert seen == [None, None]
    finally:
        await session.close()
        await runner.cleanup()

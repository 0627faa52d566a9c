"""A bare ASGI pass-through (no auth, limits, admission, routing or metering) used by ``bench proxy`` as a
baseline: the same uvicorn + aiohttp hop as the proxy, so the difference to it is what the proxy's own
features cost, and the difference to direct is what any extra hop costs on this machine.

Run: ``BENCH_UPSTREAM=http://127.0.0.1:PORT uvicorn benchmarks.serving.passthrough:app``.
"""

import os

import aiohttp

_session: aiohttp.ClientSession | None = None


async def app(scope, receive, send) -> None:
    global _session
    if scope["type"] != "http":
        return
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    url = os.environ["BENCH_UPSTREAM"] + scope["path"]
    async with _session.post(url, data=b"".join(chunks), headers={"content-type": "application/json"}) as resp:
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        while data := await resp.content.readany():
            await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})

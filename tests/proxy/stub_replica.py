"""A tiny vLLM-shaped replica for proxy tests of failure modes the simulator does not need to model
(reset before the first byte, 5xx) and for debugging before it existed. Run: python stub_replica.py PORT MODE.

Modes: ok (streams ``max_tokens`` tokens, 5 ms apart), fail (HTTP 500), reset (closes the connection).
It also counts cancelled streams at GET /stats, so tests can see that the proxy propagated a disconnect.
"""

import asyncio
import json
import sys
import time

from aiohttp import web

STATS = {"started": 0, "finished": 0, "cancelled": 0}


async def completions(request: web.Request) -> web.StreamResponse:
    mode = request.app["mode"]
    body = await request.json()
    STATS["started"] += 1
    if mode == "fail":
        return web.json_response(
            {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}, status=500
        )
    if mode == "reset":
        request.transport.close()
        return web.Response()
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    delay = float(request.app["delay"])
    chat = request.path.endswith("chat/completions")
    rid = request.headers.get("x-request-id", "x")
    prompt_tokens = 7
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}
    if not body.get("stream"):
        await asyncio.sleep(delay * n)
        STATS["finished"] += 1
        text = "".join(f"t{i} " for i in range(n))
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [choice],
                "usage": usage,
            }
        )
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    try:
        for i in range(n):
            await asyncio.sleep(delay)
            if chat:
                delta = {"role": "assistant", "content": f"t{i} "} if i == 0 else {"content": f"t{i} "}
                choice = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": "length" if i == n - 1 else None,
                }
                obj = {
                    "id": f"chatcmpl-{rid}",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": body["model"],
                    "choices": [choice],
                }
            else:
                choice = {
                    "index": 0,
                    "text": f"t{i} ",
                    "logprobs": None,
                    "finish_reason": "length" if i == n - 1 else None,
                }
                obj = {
                    "id": f"cmpl-{rid}",
                    "object": "text_completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": None,
                }
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        so = body.get("stream_options")
        if so is not None and so.get("include_usage", True):
            obj = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        STATS["finished"] += 1
    except (asyncio.CancelledError, ConnectionResetError):
        STATS["cancelled"] += 1
        raise
    return resp


async def stats(request: web.Request) -> web.Response:
    return web.json_response(STATS)


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ok"
    app = web.Application()
    app["mode"], app["delay"] = mode, sys.argv[3] if len(sys.argv) > 3 else "0.005"
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/stats", stats)
    app.router.add_get("/health", lambda r: web.Response())
    web.run_app(app, host="127.0.0.1", port=port, print=None, handler_cancellation=True)


if __name__ == "__main__":
    main()

"""Fake servers at a replica URL, for the checks that must tell a vLLM server from anything else.

    with fake_server("html_health", model="m") as url:   # http://127.0.0.1:<port>
        ...

Kinds: ``vllm`` (what vLLM answers: an empty 200 at /health, its model list, ``vllm:`` series, a streamed
completion), ``html_health`` (a web server's HTML page everywhere, with 200), ``no_metrics`` (vLLM-like but
/metrics is a 404), ``plain_metrics`` (/metrics without any vllm: series), ``wrong_model`` (serves another model
name). Each runs in a thread of this process on a free port.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KINDS = ("vllm", "html_health", "no_metrics", "plain_metrics", "wrong_model")
HTML = b"<!doctype html><html><head><title>Welcome</title></head><body>It works!</body></html>"
VLLM_METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{{engine="0",model_name="{model}"}} 0.0\n'
    'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 0.0\n'
    'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.0\n'
)


def _handler(kind: str, model: str):
    served = "some-other-model" if kind == "wrong_model" else model

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body: bytes, kind_header: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind_header)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if kind == "html_health":
                return self._send(200, HTML, "text/html; charset=utf-8")
            if self.path == "/health":
                return self._send(200, b"", "application/json")
            if self.path == "/v1/models":
                cards = [{"id": served, "object": "model", "owned_by": "vllm", "max_model_len": 4096}]
                return self._send(200, json.dumps({"object": "list", "data": cards}).encode(), "application/json")
            if self.path == "/metrics":
                if kind == "no_metrics":
                    return self._send(404, b'{"detail":"Not Found"}', "application/json")
                if kind == "plain_metrics":
                    return self._send(200, b"# TYPE process_cpu_seconds_total counter\n", "text/plain")
                return self._send(200, VLLM_METRICS.format(model=served).encode(), "text/plain; version=0.0.4")
            return self._send(404, b'{"detail":"Not Found"}', "application/json")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if kind == "html_health":
                return self._send(200, HTML, "text/html; charset=utf-8")
            chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]}
            body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            return self._send(200, body, "text/event-stream")

    return Handler


@contextlib.contextmanager
def fake_server(kind: str = "vllm", *, model: str = "m"):
    """A fake server of ``kind`` serving ``model``; yields its base URL, shuts it down on exit."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(kind, model))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

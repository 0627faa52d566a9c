"""vLLM replicas are launched publishing their KV-cache events (``--kv-events-config``) on a port of their own, which
the replica row records for the proxy; an operator's own ``--kv-events-config`` in extra_args wins."""

from __future__ import annotations

import json

from capacity.runtimes.vllm import serve_command


def config_of(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--kv-events-config") + 1])


def test_the_engine_publishes_on_its_own_port_and_host():
    config = config_of(serve_command(model="m", port=8000, host="127.0.0.1", kv_events_port=5557))
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "topic": "kv",
    }
    assert (
        config_of(serve_command(model="m", port=8000, host="0.0.0.0", kv_events_port=5557))["endpoint"]
        == "tcp://*:5557"
    )
    assert "--kv-events-config" not in serve_command(model="m", port=8000)


def test_an_operators_own_event_config_is_kept_alone():
    own = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:9999"})
    argv = serve_command(model="m", port=8000, kv_events_port=5557, extra_args=["--kv-events-config", own])
    assert argv.count("--kv-events-config") == 1 and config_of(argv)["endpoint"] == "tcp://*:9999"

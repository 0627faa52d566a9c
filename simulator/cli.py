"""Command line of a simulated replica: ``python -m simulator.cli [options]`` (``manage.py run_replica --runtime sim``
hands its command line here). No Django start-up (about a second per process saved, which matters when tests start
many replicas); prints ``READY http://host:port`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from capacity.hardware.profiles import PROFILES, ROOFLINES, get_profile
from simulator.faults import parse_fault_flags
from simulator.kv_transfer import parse_kv_transfer_config
from simulator.server import ReplicaServer, serve_forever


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime", choices=["sim"], default="sim", help="sim only (real vLLM: manage.py run_replica)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on READY)")
    parser.add_argument("--profile", default=None, help=f"sim profile: {', '.join(sorted(PROFILES))}")
    parser.add_argument(
        "--profile-opt",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a profile field, e.g. num_gpu_blocks=512",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="sim: simulated seconds per wall second")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="priority")
    parser.add_argument(
        "--runner",
        choices=["generate", "pooling"],
        default="generate",
        help="as vLLM's: generate serves completions, pooling serves /v1/embeddings",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="sim fault: hang, hang_health, slow_factor=3, error_rate=0.2, crash_after_s=5, "
        "crash_after_requests=10, fail_after_tokens=5, startup_delay_s=2",
    )
    parser.add_argument("--startup-delay", type=float, default=None, help="sim: seconds before binding")
    parser.add_argument("--model", default=None, help="the path /v1/models shows as root, as vLLM shows its --model")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-loras", type=int, default=0, help="sim: LoRA adapter slots (0: no LoRA endpoints)")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="sim: the highest adapter rank it loads")
    parser.add_argument("--lora-load-s", type=float, default=0.0, help="sim: simulated seconds an adapter load takes")
    parser.add_argument(
        "--kv-transfer-config",
        default=None,
        metavar="JSON",
        help="vLLM's KV connector for prefill/decode disaggregation: ExampleConnector (shared_storage_path) or "
        "NixlConnector (docs/disaggregation.md)",
    )
    parser.add_argument("--kv-link-gbps", type=float, default=0.0, help="sim: the KV link's bandwidth (0: instant)")
    parser.add_argument(
        "--kv-bytes-per-token",
        type=float,
        default=0.0,
        help="sim: KV bytes a token moves (default: the profile's model)",
    )


def _number(value: str):
    try:
        return int(value)
    except ValueError:
        return float(value)


def build_server(opts: dict) -> ReplicaServer:
    """The configured simulated replica; ValueError on bad options."""
    overrides = {}
    for pair in opts["profile_opt"]:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--profile-opt expects FIELD=VALUE, got {pair!r}")
        key = key.replace("-", "_")
        overrides[key] = value if key in ("model_name", "name", "model_path") else _number(value)
    if opts.get("max_num_seqs"):
        overrides["max_num_seqs"] = opts["max_num_seqs"]
    if opts.get("model"):
        overrides["model_path"] = opts["model"]  # /v1/models names it as ``root``, as vLLM names its --model
    profile = get_profile(opts["profile"], **overrides)
    faults = parse_fault_flags(opts["fault"])
    if opts.get("startup_delay") is not None:
        faults.update({"startup_delay_s": opts["startup_delay"]})
    return ReplicaServer(
        profile,
        speed=opts["speed"],
        served_model_name=opts["served_model_name"],
        scheduling_policy=opts["scheduling_policy"],
        faults=faults,
        max_loras=opts.get("max_loras") or 0,
        max_lora_rank=opts.get("max_lora_rank") or 16,
        lora_load_s=opts.get("lora_load_s") or 0.0,
        kv_transfer=parse_kv_transfer_config(opts["kv_transfer_config"]) if opts.get("kv_transfer_config") else None,
        kv_link_gbps=opts.get("kv_link_gbps") or 0.0,
        kv_bytes_per_token=_kv_bytes_per_token(profile, opts),
        runner=opts.get("runner") or "generate",
    )


def _kv_bytes_per_token(profile, opts: dict) -> float:
    """``--kv-bytes-per-token``, else (with a link) what a token of the profile's model holds in every layer."""
    if opts.get("kv_bytes_per_token") or not opts.get("kv_link_gbps"):
        return opts.get("kv_bytes_per_token") or 0.0
    if (line := ROOFLINES.get(profile.name)) is None:
        raise ValueError(f"--kv-link-gbps needs --kv-bytes-per-token: profile {profile.name} names no model shape")
    return float(line.model.kv_bytes_per_token)


async def _serve(server: ReplicaServer, host: str, port: int) -> None:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await serve_forever(server, host, port, announce=lambda line: print(line, flush=True))
    except asyncio.CancelledError:
        pass


def run(opts: dict) -> None:
    """Serve until SIGTERM/SIGINT."""
    server = build_server(opts)
    if server.kv_connector is not None:  # the connector's lines, as vLLM logs them (External Cache Hit!, ...)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    asyncio.run(_serve(server, opts["host"], opts["port"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulator.cli", description=__doc__)
    add_arguments(parser)
    opts = vars(parser.parse_args(argv))
    try:
        run(opts)
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()

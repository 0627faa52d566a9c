"""``python manage.py bench NAME [--quick | --smoke] [--plot FILE.svg]``: run one of the platform's benchmarks.

Each benchmark is a module exposing ``run(*, quick: bool, plot: str | None, progress, **options) -> dict``
and ``SMOKE``, the ``--opt`` values that shrink its quick run to a few seconds while still running every code path
and printing every key (``--smoke``: quick with those options, for CI; ``--opt`` given beside it wins). Progress
goes to stderr; the figures are printed last, as one line of JSON on stdout.

No process outlives its bench: SIGTERM and SIGHUP stop a bench as Ctrl-C does (each bench's clean-up runs), and
whatever still carries the run's mark afterwards (``capacity.runtimes.processes.BENCH_MARK``: every process a
bench starts inherits it, replicas started by its Celery worker too) is stopped before the command returns.
"""

import json
import os
import signal
import sys
import threading
import time
import uuid

from django.core.management.base import BaseCommand, CommandError

from benchmarks import protocol
from benchmarks.billing import metering, slo
from benchmarks.capacity import autoscale, economics, placement, planner
from benchmarks.operations import deploy, reliability, scale, security
from benchmarks.routing import routing
from benchmarks.serving import adapter_routing, fidelity, pd, proxy, sim
from capacity.runtimes.processes import BENCH_MARK, processes_marked, stop_marked

BENCHMARKS = {
    "sim": sim,
    "proxy": proxy,
    "routing": routing,
    "lora": adapter_routing,
    "fidelity": fidelity,
    "planner": planner,
    "economics": economics,
    "autoscale": autoscale,
    "slo": slo,
    "reliability": reliability,
    "security": security,
    "metering": metering,
    "deploy": deploy,
    "scale": scale,
    "pd": pd,
    "placement": placement,
}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
    if _running.is_set() and _stopped.is_set() and threading.current_thread() is threading.main_thread():
        # A stop whose KeyboardInterrupt was swallowed: every bench reports progress, so it ends at its next line
        # rather than running on with its signals ignored.
        _running.clear()
        raise KeyboardInterrupt


# Set by the handler: Python swallows an exception raised while a weakref callback or a finalizer runs, so a
# signal landing there would let the bench finish as if never stopped; the command reads this flag as well.
_stopped = threading.Event()
_running = threading.Event()  # the bench's run() is under way (progress may stop it)


def _stop_on_signal(signum, frame):
    # Once: a second signal must not cut the clean-up short.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _stopped.set()
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run a benchmark and print its figures as JSON on the last line. Names: " + ", ".join(BENCHMARKS)

    def add_arguments(self, parser):
        parser.add_argument("name", choices=sorted(BENCHMARKS))
        parser.add_argument("--quick", action="store_true", help="a reduced run that finishes in about a minute")
        parser.add_argument(
            "--smoke", action="store_true", help="quick with tiny sizes: seconds, every code path and JSON key (CI)"
        )
        parser.add_argument("--plot", metavar="FILE.svg", help="also draw the benchmark's curves to an SVG file")
        # Benchmark-specific options are accepted as --opt key=value pairs to keep one command.
        parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE")
        parser.add_argument("--live", action="store_true", help="run through real processes instead of the simulator")
        parser.add_argument(
            "--held-out",
            action="store_true",
            help="judge on the bench's held-out seeds (benchmarks/protocol.py); the run is logged in "
            "docs/data/held_out_log.jsonl",
        )

    def handle(self, *args, name, quick, smoke, plot, opt, live, held_out, **kwargs):
        module = BENCHMARKS[name]
        if held_out and not getattr(module, "HELD_OUT", False):
            raise CommandError(f"bench {name} has no held-out seeds (benchmarks/protocol.py)")
        extra = dict(module.SMOKE) if smoke else {}
        for pair in opt:
            key, sep, value = pair.partition("=")
            if not sep:
                raise CommandError(f"--opt expects KEY=VALUE, got {pair!r}")
            extra[key.replace("-", "_")] = value
        started = time.perf_counter()
        quick = quick or smoke
        progress(f"bench {name}{' (smoke)' if smoke else ' (quick)' if quick else ''} starting")
        os.environ[BENCH_MARK] = mark = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        previous = {}
        _stopped.clear()
        if threading.current_thread() is threading.main_thread():  # only there can Python take signals
            previous = {
                sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            }
        if held_out:
            extra["held_out"] = True  # only then: a suite without held-out data takes no such argument
        _running.set()
        try:
            figures = module.run(quick=quick, plot=plot, live=live, progress=progress, **extra)
        except BaseException as exc:
            if held_out:  # its progress lines may have shown held-out figures: a look all the same
                protocol.record_look(name, argv=sys.argv[1:], figures={"ended_early": type(exc).__name__})
            if isinstance(exc, KeyboardInterrupt):
                raise CommandError(f"bench {name} interrupted", returncode=130) from None
            raise
        finally:
            _running.clear()
            left = processes_marked(f"{BENCH_MARK}={mark}")
            if left:
                progress(f"stopping {len(left)} process(es) bench {name} left running: {left}")
                stop_marked(left)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.environ.pop(BENCH_MARK, None)
        if _stopped.is_set():  # the KeyboardInterrupt was raised where Python ignores exceptions
            raise CommandError(f"bench {name} interrupted", returncode=130)
        progress(f"bench {name} finished in {time.perf_counter() - started:.1f} s")
        if held_out:
            entry = protocol.record_look(name, argv=sys.argv[1:], figures=figures)
            progress(f"held-out look logged in {protocol.HELD_OUT_LOG} (commit {entry['commit'][:12]})")
        self.stdout.write(json.dumps(figures, sort_keys=False, default=str))

"""``python manage.py benchmark_replica --endpoint NAME [--replica NAME | --url URL] [--quick | --smoke] [--pin]``

Runs the automatic benchmark (load sweep + model-unit fit) against one live replica of the endpoint, stores it as
the next version for the endpoint's (model, hardware) pair, prints progress to stderr and the result as JSON.
"""

import json
import sys
import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from capacity.replica_benchmark.sweep import BenchmarkError
from capacity.services import SMOKE_SWEEP, benchmark_run
from endpoints.models import Endpoint, Replica


class Command(BaseCommand):
    help = "Benchmark a live replica of an endpoint and store its throughput table and model-unit fit."

    def add_arguments(self, parser):
        parser.add_argument("--endpoint", required=True, help="endpoint name (or id)")
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--replica", help="replica name (default: the endpoint's first ready replica)")
        target.add_argument("--url", help="measure this replica URL instead (e.g. a vLLM started by hand)")
        parser.add_argument("--time-scale", type=float, help="simulator speed factor (default: launch_options.speed)")
        size = parser.add_mutually_exclusive_group()
        size.add_argument("--quick", action="store_true", help="fewer levels and shapes (about a minute)")
        size.add_argument(
            "--smoke", action="store_true", help="the shortest sweep that fits the coefficients (~50 short requests)"
        )
        parser.add_argument("--pin", action="store_true", help="pin the endpoint to this benchmark")
        parser.add_argument("--max-concurrency", type=int, help="highest concurrency to try")

    def handle(self, *args, endpoint, replica, url, time_scale, quick, smoke, pin, max_concurrency, **options):
        lookup = {"pk": int(endpoint)} if endpoint.isdigit() else {"name": endpoint}
        try:
            target = Endpoint.objects.select_related("model_profile", "hardware_profile").get(**lookup)
        except Endpoint.DoesNotExist:
            raise CommandError(f"no endpoint {endpoint!r}") from None
        chosen = None
        if replica:
            chosen = Replica.objects.filter(endpoint=target, name=replica).first()
            if chosen is None:
                raise CommandError(f"endpoint {target.name} has no replica {replica!r}")
        if time_scale is not None and time_scale <= 0:
            raise CommandError("--time-scale must be positive")
        overrides = {
            **(SMOKE_SWEEP if smoke else {}),
            **({"max_concurrency": max_concurrency} if max_concurrency else {}),
        }
        started = time.monotonic()

        def progress(message: str) -> None:
            print(f"[{time.monotonic() - started:6.1f} s] {message}", file=sys.stderr, flush=True)

        try:
            benchmark = benchmark_run(
                endpoint=target, replica=chosen, url=url, time_scale=time_scale, quick=quick or smoke, pin=pin,
                overrides=overrides, progress=progress,
            )  # fmt: skip
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except BenchmarkError as exc:
            raise CommandError(f"benchmark failed: {exc}") from exc
        self.stdout.write(
            json.dumps(
                {
                    "benchmark": benchmark.pk,
                    "version": benchmark.version,
                    "b_max": benchmark.b_max,
                    "alpha": benchmark.alpha,
                    "alpha_cached": benchmark.alpha_cached,
                    "beta": benchmark.beta,
                    "gamma": benchmark.gamma,
                    "mu_per_min": benchmark.mu_per_min,
                    "fit_error": benchmark.fit_error,
                    "throughput_table": benchmark.throughput_table,
                }
            )
        )

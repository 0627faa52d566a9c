"""``python manage.py plan_capacity --rate 20 --input 500 --output 300 [--endpoint E | --model M --hardware H]``

The three-barrier planner from the command line: the model and hardware come from an endpoint or from profiles
(or ``--worked-example`` for the figures of docs/algorithms.md#the-worked-example), the throughput table from a
stored benchmark or ``--table``.
Prints the explanation and the figures as JSON (``--json`` for JSON only).
"""

import json

from django.core.management.base import BaseCommand, CommandError

from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.planning.barriers import WORKED_EXAMPLE, PlannerInputError, plan
from capacity.planning.inputs import PlanRequest, plan_from_request
from endpoints.models import Endpoint


def _lookup(model, value: str, what: str):
    try:
        return model.objects.get(pk=int(value)) if value.isdigit() else model.objects.get(name=value)
    except model.DoesNotExist:
        raise CommandError(f"no {what} {value!r}") from None


class Command(BaseCommand):
    help = "Plan replicas for a workload under an SLO (memory, throughput and latency barriers)."

    def add_arguments(self, parser):
        parser.add_argument("--worked-example", action="store_true", help="docs/algorithms.md's 13B example")
        parser.add_argument("--endpoint")
        parser.add_argument("--model", help="model profile name or id")
        parser.add_argument("--hardware", help="hardware profile name or id")
        parser.add_argument("--benchmark", type=int, help="benchmark id for the throughput table")
        parser.add_argument("--table", help='JSON list of rows, e.g. [{"batch": 64, "per_stream_tok_s": 68}]')
        parser.add_argument("--rate", type=float, help="λ, requests per second")
        parser.add_argument("--input", type=float, help="mean input tokens")
        parser.add_argument("--output", type=float, help="mean output tokens")
        parser.add_argument("--context", type=float, help="KV tokens held per request (default input + output)")
        parser.add_argument("--min-stream-tok-s", type=float, help="SLO: per-stream decode rate")
        parser.add_argument("--tpot-ms", type=float, help="SLO as time per output token")
        parser.add_argument("--ttft-s", type=float, help="TTFT used in W (default: the table's TTFT p50 at B_max)")
        parser.add_argument("--headroom", type=float, default=0.0)
        parser.add_argument("--spike", type=float, help="load multiplier of a spike scenario")
        parser.add_argument("--cold-start-s", type=float, default=90.0)
        parser.add_argument("--ceiling", type=float, default=0.8, help="utilization ceiling during the spike")
        parser.add_argument("--json", action="store_true", help="JSON only")

    def handle(self, *args, **o):
        try:
            if o["worked_example"]:
                result, sources = plan(**WORKED_EXAMPLE), {"throughput_table": "docs/algorithms.md#the-worked-example"}
            else:
                result, sources = plan_from_request(self._request(o))
        except PlannerInputError as exc:
            raise CommandError(f"invalid input: {exc}") from exc
        if not o["json"]:
            self.stderr.write(result.explanation)
        self.stdout.write(json.dumps({**result.as_dict(), "sources": sources}, default=str))

    def _request(self, o) -> PlanRequest:
        missing = [
            flag for flag, key in (("--rate", "rate"), ("--input", "input"), ("--output", "output")) if o[key] is None
        ]
        if missing:
            raise CommandError(f"give {', '.join(missing)} (or --worked-example)")
        workload = {"arrival_rate_per_s": o["rate"], "input_tokens": o["input"], "output_tokens": o["output"]}
        if o["context"] is not None:
            workload["context_tokens"] = o["context"]
        slo = {}
        if o["min_stream_tok_s"] is not None:
            slo["min_stream_tok_s"] = o["min_stream_tok_s"]
        if o["tpot_ms"] is not None:
            slo["tpot_ms"] = o["tpot_ms"]
        table = None
        if o["table"]:
            try:
                table = json.loads(o["table"])
            except ValueError as exc:
                raise CommandError(f"--table is not JSON: {exc}") from exc
            if not isinstance(table, list):
                raise CommandError("--table must be a JSON list of rows")
        return PlanRequest(
            workload=workload,
            endpoint=_lookup(Endpoint, o["endpoint"], "endpoint") if o["endpoint"] else None,
            model_profile=_lookup(ModelProfile, o["model"], "model profile") if o["model"] else None,
            hardware_profile=_lookup(HardwareProfile, o["hardware"], "hardware profile") if o["hardware"] else None,
            benchmark=CapacityBenchmark.objects.filter(pk=o["benchmark"]).first() if o["benchmark"] else None,
            throughput_table=table,
            slo=slo or None,
            headroom=o["headroom"],
            ttft_s=o["ttft_s"],
            spike={
                "load_multiplier": o["spike"],
                "cold_start_s": o["cold_start_s"],
                "utilization_ceiling": o["ceiling"],
            }
            if o["spike"]
            else None,
        )

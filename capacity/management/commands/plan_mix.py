"""``python manage.py plan_mix --profile H100:llama-8b-h100 --profile L40S:llama-8b-l40s --bucket chat:512:128:20
--ttft-s 1 --tpot-s 0.05``

The heterogeneous planner from the command line (docs/algorithms.md#the-heterogeneous-planner): each ``--profile``
is a stored hardware profile (name or id) and the simulator roofline profile its per-bucket capacity comes from;
each ``--bucket`` is ``NAME:PROMPT_TOKENS:OUTPUT_TOKENS:RATE_RPS`` (or ``--workload short_chat|long_docs|mixed``,
bench economics' histograms). Prints the plan as JSON.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from capacity.models import HardwareProfile
from capacity.planning.inputs import plan_mix_from_profiles
from capacity.planning.mix import PlanError
from capacity.planning.presets import WORKLOADS


def _hardware(value: str) -> HardwareProfile:
    try:
        if value.isdigit():
            return HardwareProfile.objects.get(pk=int(value))
        return HardwareProfile.objects.get(name=value)
    except HardwareProfile.DoesNotExist:
        raise CommandError(f"no hardware profile {value!r}") from None


def _bucket(value: str) -> dict:
    parts = value.split(":")
    try:
        name, prompt, output, rate = parts
        return {"name": name, "prompt_tokens": int(prompt), "output_tokens": int(output), "rate_rps": float(rate)}
    except ValueError:
        raise CommandError(f"--bucket expects NAME:PROMPT:OUTPUT:RATE, got {value!r}") from None


class Command(BaseCommand):
    help = "The cheapest mix of hardware profiles that serves a request-size histogram within a TTFT/TPOT SLO."

    def add_arguments(self, parser):
        parser.add_argument("--profile", action="append", default=[], metavar="HARDWARE:SIM_PROFILE")
        parser.add_argument("--bucket", action="append", default=[], metavar="NAME:PROMPT:OUTPUT:RATE")
        parser.add_argument("--workload", choices=["short_chat", "long_docs", "mixed"])
        parser.add_argument("--ttft-s", type=float, default=1.0)
        parser.add_argument("--tpot-s", type=float, default=0.05)
        parser.add_argument("--time-limit-s", type=float, default=10.0)

    def handle(self, *args, profile, bucket, workload, ttft_s, tpot_s, time_limit_s, **options):
        if not profile:
            raise CommandError("give at least one --profile HARDWARE:SIM_PROFILE")
        pairs = []
        for item in profile:
            hardware, sep, sim_profile = item.rpartition(":")
            if not sep:
                raise CommandError(f"--profile expects HARDWARE:SIM_PROFILE, got {item!r}")
            pairs.append((_hardware(hardware), sim_profile))
        buckets = [_bucket(b) for b in bucket]
        if workload:
            buckets += [vars(b).copy() for b in WORKLOADS[workload]]
        if not buckets:
            raise CommandError("give --bucket NAME:PROMPT:OUTPUT:RATE or --workload")
        try:
            result = plan_mix_from_profiles(
                profiles=pairs, buckets=buckets, ttft_s=ttft_s, tpot_s=tpot_s, time_limit_s=time_limit_s
            )
        except (PlanError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result))

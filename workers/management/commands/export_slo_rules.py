"""``python manage.py export_slo_rules [--output FILE] [--slo ID …]``: the SLOs as Prometheus rules (YAML)."""

import yaml
from django.core.management.base import BaseCommand, CommandError

from billing.alerts import slo_spec
from billing.models import SLO
from billing.prometheus_rules import SloRuleSpec, rule_groups
from gateway.proxy.metrics import TPOT_BUCKETS, TTFT_BUCKETS


class Command(BaseCommand):
    help = "Export every enabled SLO as Prometheus recording and multiwindow burn-rate alerting rules."

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", help="write to this file instead of stdout")
        parser.add_argument("--slo", type=int, action="append", help="only these SLO ids")

    def handle(self, *args, output=None, slo=None, **options):
        slos = SLO.objects.filter(enabled=True).select_related("endpoint", "tenant").order_by("pk")
        if slo:
            slos = slos.filter(pk__in=slo)
            missing = set(slo) - set(slos.values_list("pk", flat=True))
            if missing:
                raise CommandError(f"no enabled SLO with id {', '.join(map(str, sorted(missing)))}")
        specs = []
        for item in slos:
            spec = slo_spec(item)
            specs.append(
                SloRuleSpec(
                    slo_id=item.pk,
                    name=item.name,
                    sli=item.sli,
                    objective=item.objective,
                    endpoint=item.endpoint.name,
                    tenant=item.tenant.slug if item.tenant_id else None,
                    ttft_ms=spec.ttft_ms,
                    tpot_ms=spec.tpot_ms,
                )
            )
        text = yaml.safe_dump(
            rule_groups(specs, ttft_buckets_s=TTFT_BUCKETS, tpot_buckets_s=TPOT_BUCKETS), sort_keys=False, width=1000
        )
        if output:
            with open(output, "w", encoding="utf-8") as handle:
                handle.write(text)
            self.stderr.write(f"wrote {len(specs)} SLOs' rules to {output}")
        else:
            self.stdout.write(text)

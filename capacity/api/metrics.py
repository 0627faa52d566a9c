"""``GET /metrics/platform``: the platform's books as Prometheus gauges, for the dashboards (platform/grafana/).

The proxy's ``/metrics`` counts requests as they pass; this reads what only the database knows, at scrape time
(a handful of queries per scrape, never per request): each endpoint's have / sold / used MU per minute (the
capacity ledger), its ready replicas and latency SLOs, the autoscaler's last decision per axis, and the last
hourly cost report (dollars per million good tokens). Same bearer token as the proxy's ``/metrics``.
"""

import hmac
import os

from django.conf import settings
from django.db.models import Max
from django.http import HttpResponse, HttpResponseNotFound
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from billing.models import CostReport
from capacity.ledger import capacity_ledger
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint
from tenants.models import Tenant

# Every series this view exposes, with its labels: the dashboard generator checks its panels against this list.
PLATFORM_METRICS: dict[str, tuple[str, ...]] = {
    "infercap_capacity_mu_per_min": ("endpoint", "measure"),
    "infercap_tenant_mu_per_min": ("endpoint", "tenant", "measure"),
    "infercap_endpoint_ready_replicas": ("endpoint",),
    "infercap_endpoint_ttft_slo_seconds": ("endpoint",),
    "infercap_endpoint_tpot_slo_seconds": ("endpoint",),
    "infercap_autoscaler_desired": ("endpoint", "axis"),
    "infercap_autoscaler_current": ("endpoint", "axis"),
    "infercap_cost_usd_per_million_good_tokens": ("endpoint",),
    "infercap_cost_usd_per_hour": ("endpoint",),
}


class PlatformCollector:
    def collect(self):
        families = {
            name: GaugeMetricFamily(name, name.replace("_", " "), labels=list(labels))
            for name, labels in PLATFORM_METRICS.items()
        }
        ledger = capacity_ledger()
        for row in ledger.endpoints:
            for measure, value in (
                ("have", row.have_mu_per_min),
                ("sold", row.sold_mu_per_min),
                ("used", row.used_mu_per_min_1m),
            ):
                families["infercap_capacity_mu_per_min"].add_metric([row.endpoint, measure], value)
            families["infercap_endpoint_ready_replicas"].add_metric([row.endpoint], row.ready_replicas)
        # By slug, the proxy's tenant label, so one dashboard variable filters both.
        slugs = dict(Tenant.objects.values_list("pk", "slug"))
        for row in ledger.tenants:
            for measure, value in (("sold", row.reserved_mu_per_min), ("used", row.used_mu_per_min_1m)):
                tenant = slugs.get(row.tenant_id, str(row.tenant_id))
                families["infercap_tenant_mu_per_min"].add_metric([row.endpoint, tenant, measure], value)
        for name, ttft_ms, tpot_ms in Endpoint.objects.values_list("name", "ttft_slo_ms", "tpot_slo_ms"):
            families["infercap_endpoint_ttft_slo_seconds"].add_metric([name], ttft_ms / 1000)
            families["infercap_endpoint_tpot_slo_seconds"].add_metric([name], tpot_ms / 1000)
        self._decisions(families)
        self._costs(families)
        yield from families.values()

    @staticmethod
    def _decisions(families) -> None:
        latest = AutoscalerDecision.objects.values("endpoint_id", "axis").annotate(at=Max("at"))
        wanted = {(d["endpoint_id"], d["axis"], d["at"]) for d in latest}
        rows = AutoscalerDecision.objects.filter(at__in={at for _, _, at in wanted}).select_related("endpoint")
        for d in rows:
            if (d.endpoint_id, d.axis, d.at) in wanted:
                families["infercap_autoscaler_desired"].add_metric([d.endpoint.name, d.axis], d.desired)
                families["infercap_autoscaler_current"].add_metric([d.endpoint.name, d.axis], d.current)

    @staticmethod
    def _costs(families) -> None:
        hourly = CostReport.objects.filter(granularity=CostReport.Granularity.HOUR, tenant__isnull=True)
        last = hourly.values("endpoint_id").annotate(start=Max("start"))
        wanted = {(r["endpoint_id"], r["start"]) for r in last}
        for report in hourly.filter(start__in={s for _, s in wanted}).select_related("endpoint"):
            if (report.endpoint_id, report.start) in wanted:
                hours = max((report.end - report.start).total_seconds() / 3600, 1e-9)
                families["infercap_cost_usd_per_hour"].add_metric([report.endpoint.name], report.usd / hours)
                if report.usd_per_1m_good_tokens is not None:
                    families["infercap_cost_usd_per_million_good_tokens"].add_metric(
                        [report.endpoint.name], report.usd_per_1m_good_tokens
                    )


def platform_metrics(request):
    token = (os.environ.get("INFERCAP_METRICS_TOKEN") or settings.INFERCAP.get("METRICS_TOKEN") or "").encode()
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
        return HttpResponseNotFound()  # as the proxy's /metrics: nothing to learn without the token
    registry = CollectorRegistry()
    registry.register(PlatformCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

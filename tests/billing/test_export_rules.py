"""``export_slo_rules``: valid YAML with seven recording rules and the four window-pair alerts per SLO."""

import io

import pytest
import yaml
from django.core.management import CommandError, call_command

from billing.slo import WINDOW_PAIRS, WINDOWS_S
from tests.factories import SLOFactory


def _export(*args) -> dict:
    out = io.StringIO()
    call_command("export_slo_rules", *args, stdout=out)
    return yaml.safe_load(out.getvalue())


def test_rules_parse_and_hold_four_window_pairs_per_slo(tenant_a):
    availability = SLOFactory(endpoint=tenant_a.endpoint, tenant=tenant_a.tenant, objective=0.999, name='av "quoted"')
    ttft = SLOFactory(endpoint=tenant_a.endpoint, sli="ttft", objective=0.99, ttft_ms=2000, name="ttft")
    goodput = SLOFactory(endpoint=tenant_a.endpoint, sli="goodput", objective=0.95, name="goodput")
    SLOFactory(endpoint=tenant_a.endpoint, enabled=False)
    rules = _export()
    groups = {g["name"]: g["rules"] for g in rules["groups"]}
    assert set(groups) == {f"infercap-slo-{s.pk}" for s in (availability, ttft, goodput)}
    for slo in (availability, ttft, goodput):
        group = groups[f"infercap-slo-{slo.pk}"]
        records = {r["record"] for r in group if "record" in r}
        assert records == {f"slo:sli_error:ratio_rate{w}" for w in WINDOWS_S}
        alerts = [r for r in group if "alert" in r]
        pairs = {(a["labels"]["severity"], a["labels"]["long_window"], a["labels"]["short_window"]) for a in alerts}
        assert pairs == {(p.severity, p.long_window, p.short_window) for p in WINDOW_PAIRS}
        for alert in alerts:
            pair = next(p for p in WINDOW_PAIRS if p.long_window == alert["labels"]["long_window"])
            budget = 1 - slo.objective
            assert (
                f'ratio_rate{pair.long_window}{{slo_id="{slo.pk}"}} > ({pair.burn_rate:g} * {budget:.10g})'
                in alert["expr"]
            )
            assert f"ratio_rate{pair.short_window}{{" in alert["expr"]
            assert alert["for"] == ("1m" if pair.severity == "page" else "5m")
    av_5m = next(r for r in groups[f"infercap-slo-{availability.pk}"] if r.get("record", "").endswith("rate5m"))
    assert 'tenant="tenant-a"' in av_5m["expr"] and 'status=~"shed|upstream_error|timeout"' in av_5m["expr"]
    assert av_5m["labels"]["slo"] == 'av "quoted"'
    ttft_1h = next(r for r in groups[f"infercap-slo-{ttft.pk}"] if r.get("record", "").endswith("rate1h"))
    # 2 s snaps to the proxy's largest TTFT bucket not above it (1.0 s; the next is 2.5 s).
    assert 'infercap_proxy_ttft_seconds_bucket{endpoint="a-model",le="1.0"}[1h]' in ttft_1h["expr"]


def test_output_file_and_unknown_slo(tenant_a, tmp_path):
    slo = SLOFactory(endpoint=tenant_a.endpoint)
    target = tmp_path / "rules.yaml"
    call_command("export_slo_rules", "--output", str(target), "--slo", str(slo.pk), stderr=io.StringIO())
    assert len(yaml.safe_load(target.read_text())["groups"]) == 1
    with pytest.raises(CommandError):
        call_command("export_slo_rules", "--slo", "999999")

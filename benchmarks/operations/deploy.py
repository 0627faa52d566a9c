"""``python manage.py bench deploy [--quick]``: is the platform deployable and observable with operators' tools?

- the Kubernetes package rendered (base, dev, prod) and every object validated (``workers/manifests.py``);
- ``promtool test rules`` on the generated scenario (``billing/rule_scenario.py``): the platform's alerts at the
  same steps as Prometheus';
- a real Prometheus scraping a real proxy and replica, its 5 m burn rate against the platform's
  (``benchmarks/operations/prometheus_check.py``; needs PostgreSQL and Redis; runs on a throwaway database);
- the production boot (``benchmarks/operations/production_boot.py``): the prod overlay's containers and the image started
  with the production settings, probed as the kubelet probes them (``production_boot.checks``, ``.failures``);
- without ``--quick``: a fresh clone to the first streamed token of ``make run``
  (``scripts/fresh_clone_first_token.py``, 2-4 minutes here).

- tracing's cost (``tracing_added_ttft_p50_ms``): a small paired on/off measurement of the proxy's own path in
  process (``benchmarks/serving/tracing_overhead.py``, 1,500 pairs quick, 10,000 full; ~30 s), not the
  end-to-end one, which is ``bench proxy --opt tracing=1`` (minutes, and milliseconds of noise at one stream here).
- ``make_run_soak``: `make run` on the embedded default under completions, 2 minutes quick, 10 full
  (``benchmarks/operations/make_run_soak.py``; ``--opt soak_minutes=M``; ``--opt only=make_run_soak`` runs it alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from django.conf import settings

from benchmarks.harness.throwaway_database import throwaway_database
from benchmarks.operations import make_run_soak, production_boot, prometheus_check
from benchmarks.serving import tracing_overhead
from billing.models import SLO
from billing.rule_scenario import promtool_test
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint
from gateway.proxy.metrics import TPOT_BUCKETS, TTFT_BUCKETS
from tenants.models import CapacityReservation, Tenant
from tenants.services import api_key_create
from workers import manifests

ROOT = Path(__file__).resolve().parents[2]


def _manifests(progress) -> dict:
    if manifests.kubectl() is None:
        progress("kubectl not installed: manifests not rendered")
        return {"manifests_validated": None, "manifests_invalid": None}
    results = manifests.validate_all()
    invalid = [problem for r in results.values() for problem in r.invalid]
    total = sum(len(r.objects) for r in results.values())
    progress(f"manifests: {total} objects over {len(results)} renders, {len(invalid)} invalid")
    return {"manifests_validated": total - len(invalid), "manifests_invalid": len(invalid), "invalid": invalid}


def _promtool(progress) -> dict:
    if shutil.which("promtool") is None:
        return {"promtool_rule_tests_passed": None}
    with tempfile.TemporaryDirectory() as tmp:
        rules, test, summary = promtool_test("rules.yml", buckets=(TTFT_BUCKETS, TPOT_BUCKETS))
        Path(tmp, "rules.yml").write_text(yaml.safe_dump(rules))
        Path(tmp, "test.yml").write_text(yaml.safe_dump(test))
        run = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp, capture_output=True, text=True)
    passed = run.returncode == 0
    progress(f"promtool test rules: {'passed' if passed else 'FAILED'} ({summary['alert_steps_checked']} alert steps)")
    return {
        "promtool_rule_tests_passed": passed,
        "promtool_alert_steps_checked": summary["alert_steps_checked"],
        "promtool_burn_rate_samples_checked": summary["burn_rate_samples_checked"],
        "first_firing_minute": summary["first_firing_minute"],
    }


def _world() -> tuple[Endpoint, str, SLO]:
    model, _ = ModelProfile.objects.get_or_create(
        name="llama-13b",
        defaults={"parameters_b": 13, "n_layers": 40, "n_kv_heads": 8, "d_head": 128, "weights_gb": 26},
    )
    hardware, _ = HardwareProfile.objects.get_or_create(
        name="a100-80g",
        defaults={
            "gpu_type": "A100-80GB",
            "gpus_per_replica": 1,
            "gpu_memory_gb": 80,
            "memory_bandwidth_gbps": 2039,
            "usd_per_gpu_hour": 2.5,
        },
    )
    tenant = Tenant.objects.create(name="Deploy bench", slug="deploy-bench")
    endpoint = Endpoint.objects.create(name="deploy-bench", model_profile=model, hardware_profile=hardware)
    CapacityReservation.objects.create(tenant=tenant, endpoint=endpoint, mu_per_min=1e6)
    _, raw_key = api_key_create(tenant=tenant, name="deploy bench", scopes=["inference"])
    slo = SLO.objects.create(name="availability", endpoint=endpoint, sli="availability", objective=0.99)
    return endpoint, raw_key, slo


def _prometheus(progress, requests: int) -> dict:
    if prometheus_check.prometheus_binary() is None:
        return {"prometheus_vs_platform_burn_rate_max_err": None}
    if settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis:
        raise RuntimeError("bench deploy starts a proxy, which needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    with throwaway_database("deploy", progress):
        endpoint, raw_key, slo = _world()
        result = prometheus_check.compare(
            endpoint=endpoint, raw_key=raw_key, slo=slo, requests=requests, progress=progress
        )
    progress(
        f"5 m error ratio: prometheus {result['prometheus_error_ratio_5m']:.6f}, "
        f"platform {result['platform_error_ratio_5m']:.6f} ({result['relative_error']:.3%})"
    )
    return {
        "prometheus_vs_platform_burn_rate_max_err": round(result["relative_error"], 6),
        "prometheus_error_ratio_5m": result["prometheus_error_ratio_5m"],
        "platform_error_ratio_5m": result["platform_error_ratio_5m"],
        "prometheus_check_requests": requests,
    }


def _fresh_clone(progress) -> dict:
    progress("fresh clone → make run → first streamed token (a few minutes)")
    run = subprocess.run(
        # The system interpreter, as a newcomer's: the script makes its own .venv.
        [shutil.which("python3") or sys.executable, str(ROOT / "scripts" / "fresh_clone_first_token.py")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if run.returncode != 0:
        progress(f"fresh clone failed: {run.stderr[-2000:]}")
        return {"fresh_clone_to_first_token_s": None}
    figure = json.loads(run.stdout.strip().splitlines()[-1])["fresh_clone_to_first_token_s"]
    progress(f"fresh clone to first token: {figure} s")
    return {"fresh_clone_to_first_token_s": figure, "load_average_1m": round(os.getloadavg()[0], 1)}


# --smoke: a 15 s soak, 40 requests for Prometheus, 200 tracing pairs.
SMOKE = {"soak_minutes": "0.25", "requests": "40", "pairs": "200"}


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    if opts.get("only") == "production_boot":
        return production_boot.bench(progress)
    soak_minutes = float(opts.get("soak_minutes", 2 if quick else 10))
    if opts.get("only") == "make_run_soak":
        return {"make_run_soak": make_run_soak.run(minutes=soak_minutes, progress=progress)}
    figures: dict = {"fresh_clone_to_first_token_s": None}
    figures |= _manifests(progress)
    figures |= _promtool(progress)
    figures |= _prometheus(progress, requests=int(opts.get("requests", 400 if quick else 1500)))
    # The shipped image and manifests booted with the production settings and probed (production_boot.py).
    figures |= production_boot.bench(progress)
    if not quick:
        figures |= _fresh_clone(progress)
    # The in-process paired on/off measurement (seconds); the end-to-end one is bench proxy --opt tracing=1.
    figures |= tracing_overhead.run(
        quick=quick, progress=progress, **({"pairs": opts["pairs"]} if "pairs" in opts else {})
    )
    figures["make_run_soak"] = make_run_soak.run(minutes=soak_minutes, progress=progress)
    return figures

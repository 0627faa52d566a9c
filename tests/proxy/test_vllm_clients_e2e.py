"""The clients operators already run against vLLM work against the proxy with their default options: the probes
(``/health``, ``/ping``, ``/version``, ``/v1/models``) answer as vLLM's do, and vLLM's own benchmarking client
(``vllm bench serve``, from the engine's environment) drives a run through the proxy end to end.

vLLM's client rather than guidellm: it is the reference client of that family (guidellm validates a backend the
same way, ``GET /health`` then ``/v1/models``), it reads ``root`` from ``/v1/models`` to load its tokenizer, and it
is already installed with the engine (no new download in CI)."""

import json
import subprocess

import httpx
import pytest

from billing.models import UsageRecord
from capacity.models import ModelProfile
from capacity.runtimes.processes import ENGINE_PY, ROOT, engine_installed
from gateway.proxy import app
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import wait_for

TINY_MODEL = ROOT / "var" / "engine" / "tiny-llama"
# `python -m vllm ...` of the CPU build fails on a metadata lookup; the bench's own entry point does not.
BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


async def test_health_is_503_with_an_empty_body_while_the_configuration_cannot_load(monkeypatch):
    async def no_database():
        raise OSError("connection refused")

    sent = []

    async def send(message):
        sent.append(message)

    monkeypatch.setattr(app, "get_state", no_database)
    await app.application({"type": "http", "path": "/health", "method": "GET", "headers": []}, None, send)
    assert sent[0]["status"] == 503 and sent[1]["body"] == b""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not engine_installed() or not TINY_MODEL.is_dir(), reason="needs .venv-engine (make engine)")
def test_vllm_bench_serve_runs_through_the_proxy_with_default_options(procs, clean_redis, tenant_a, tmp_path):
    # The model the replicas load is a local path, so the client finds its tokenizer from /v1/models' root.
    ModelProfile.objects.filter(pk=tenant_a.endpoint.model_profile_id).update(name=str(TINY_MODEL))
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1")
    base = spawn_proxy(procs)
    wait_for(lambda: httpx.get(base + "/health", timeout=5).status_code == 200, 20)
    _assert_probes_answer_as_vllm_does(base, tenant_a)
    prompts = 12
    # Only the workload's size is set (its defaults are 1,000 prompts of 1,024 tokens) and the key, as for a vLLM
    # server started with --api-key (the client sends OPENAI_API_KEY on completions, --header on every call,
    # /v1/models included); the model, tokenizer, endpoint (/v1/completions) and backend are the client's defaults.
    argv = [str(ENGINE_PY), "-c", BENCH_SERVE, "--base-url", base, "--num-prompts", str(prompts)]
    argv += ["--input-len", "32", "--output-len", "8", "--save-result", "--result-dir", str(tmp_path)]
    argv += ["--header", f"Authorization=Bearer {tenant_a.raw_key}"]
    env = {"OPENAI_API_KEY": tenant_a.raw_key, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (result_file,) = tmp_path.glob("*.json")
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"]) == (prompts, 0)
    assert result["model_id"] == str(TINY_MODEL) and result["total_output_tokens"] > 0
    assert result["median_ttft_ms"] > 0
    # Every request was metered, as the tenant's.
    wait_for(lambda: UsageRecord.objects.filter(tenant=tenant_a.tenant, status="ok").count() >= prompts, 15)
    assert UsageRecord.objects.exclude(tenant=tenant_a.tenant).count() == 0


def _assert_probes_answer_as_vllm_does(base: str, tenant_a) -> None:
    for method, path in [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")]:
        r = httpx.request(method, base + path, timeout=10)
        assert (r.status_code, r.content) == (200, b""), (method, path)
    version = httpx.get(base + "/version", timeout=10)
    assert version.status_code == 200 and set(version.json()) == {"version"} and version.json()["version"]
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 401, "the model list still needs a key"
    listed = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {tenant_a.raw_key}"}, timeout=10)
    assert listed.status_code == 200, listed.text
    card = listed.json()["data"][0]
    assert card["id"] == tenant_a.endpoint.name and card["root"] == str(TINY_MODEL)
    assert card["object"] == "model" and card["parent"] is None and card["max_model_len"] > 0
    assert httpx.post(base + "/health", timeout=10).status_code == 404, "vLLM serves /health on GET only"

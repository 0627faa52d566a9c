"""The production boot: the shipped image and manifests started as an operator installs them, then checked as the
kubelet and an operator check them (``tests/deploy/``, and ``bench deploy``'s ``production_boot``).

The manifests are rendered with ``kubectl kustomize`` (the prod overlay); each infercap container's command line is
the image's ENTRYPOINT and CMD (parsed from the Dockerfile) with the container's ``command``/``args`` applied as
Kubernetes applies them, and its environment the image's ENV, then ``envFrom`` (the ConfigMap as shipped, the
Secret's values given by the caller), then ``env``. What a pod has that a machine has not is mapped, and only that:
the image's virtual environment (``/opt/venv``) is this interpreter's, each pod's ``/tmp`` (an ``emptyDir``) is a
folder of its own, container port 8000 is a free port, ``HOSTNAME`` is this machine's name (a pod's is its own), the
API server the service account would reach is a recording stand-in (``INFERCAP_KUBERNETES_API_URL``). Every probe
is sent by its declared path and port with the pod IP as Host, as the kubelet sends it. The Dockerfile's own
CMD and HEALTHCHECK run the same way with the image's ENV and the Secret (``docker run --env-file``).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from benchmarks.harness.throwaway_database import throwaway_database
from benchmarks.operations.production_pods import (
    CONTAINER_PORT,
    POD_IP,
    Container,
    Image,
    Pod,
    RecordingApiServer,
    containers,
    dockerfile_image,
    until,
)
from capacity.models import HardwareProfile, ModelProfile
from capacity.runtimes.processes import ProcessGroup, database_url, free_port, sim_replica_argv
from endpoints.models import Endpoint, Replica, ReplicaState
from tenants.models import CapacityReservation, Tenant, User
from tenants.services import api_key_create
from workers import manifests

OVERLAY = "overlays/prod"
# The documented way to create the first operator (platform/README.md), run in a web pod as `kubectl exec` would.
FIRST_OPERATOR = ["python", "manage.py", "create_operator", "--username", "first-operator"]


@dataclass
class Checks:
    progress: object = print
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def record(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, ok, detail))
        self.progress(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
        return ok

    def run(self, name: str, check) -> bool:
        """``check()`` returns True, or a string saying what was wrong; an exception is a failure too."""
        try:
            outcome = check()
        except Exception as exc:  # noqa: BLE001 - every failure is a finding, reported with its check
            outcome = f"{type(exc).__name__}: {exc}"
        return self.record(name, outcome is True, "" if outcome is True else str(outcome)[-600:])

    def summary(self) -> dict:
        failed = [f"{name}: {detail}" for name, ok, detail in self.results if not ok]
        return {"checks": len(self.results), "failures": len(failed), "failed": failed}


# -- the world an operator has set up: an endpoint with a replica, a tenant's key, an autoscaled endpoint ---------
def boot_world(procs: ProcessGroup) -> dict:
    model, _ = ModelProfile.objects.get_or_create(
        name="boot-model", defaults={"parameters_b": 1, "n_layers": 4, "n_kv_heads": 2, "d_head": 64, "weights_gb": 2}
    )
    hardware, _ = HardwareProfile.objects.get_or_create(
        name="boot-gpu",
        defaults={"gpu_type": "L4", "gpus_per_replica": 1, "gpu_memory_gb": 24, "memory_bandwidth_gbps": 300,
                  "usd_per_gpu_hour": 0.8},
    )  # fmt: skip
    tenant = Tenant.objects.create(name="Boot tenant", slug="boot-tenant")
    # An attached replica (static: the worker's actuator leaves it alone) behind the completion checks.
    chat = Endpoint.objects.create(
        name="boot-chat", model_profile=model, hardware_profile=hardware, launch_options={"actuator": "static"}
    )
    CapacityReservation.objects.create(tenant=tenant, endpoint=chat, mu_per_min=1e6)
    _, key = api_key_create(tenant=tenant, name="boot", scopes=["inference"])
    port = free_port()
    procs.spawn(sim_replica_argv(port, speed=20, served_model_name=chat.name), port=port)
    Replica.objects.create(endpoint=chat, name="boot-r1", url=f"http://127.0.0.1:{port}", state=ReplicaState.READY,
                           concurrency_limit=16)  # fmt: skip
    # Autoscaled by whatever actuator the worker's environment names (the manifest: kubernetes).
    Endpoint.objects.create(
        name="boot-scaled", model_profile=model, hardware_profile=hardware, launch_options={"namespace": "infercap"}
    )
    return {"key": key, "model": chat.name}


def default_secret() -> dict[str, str]:
    """The Secret's values an operator fills in: this process's PostgreSQL and Redis, fresh secrets."""
    return {
        "DJANGO_SECRET_KEY": os.urandom(40).hex(),
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "INFERCAP_METRICS_TOKEN": os.urandom(16).hex(),
    }


# -- the checks ---------------------------------------------------------------------------------------------------
def _static_checks(checks: Checks, objects: list[dict], image: Image, found: dict[str, Container]) -> None:
    uid = image.user.split(":")[0]
    checks.run(
        "image user is numeric, not root, and the pods' runAsUser",
        lambda: (
            (uid.isdigit() and int(uid) != 0 and {c.run_as_user for c in found.values()} == {int(uid)})
            or f"USER {image.user}, pods {sorted(str(c.run_as_user) for c in found.values())}"
        ),
    )
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    used = {o["metadata"].get("namespace") for o in objects} - {None}
    checks.run(
        "the overlay's namespace is created with it", lambda: used <= namespaces or f"{used} not in {namespaces}"
    )
    images = [c["image"] for o in objects if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"] if c["image"].startswith("vllm/")]  # fmt: skip
    checks.run(
        "the vLLM replica image is pinned to a version",
        lambda: (images and all(":" in i and not i.endswith((":latest", ":nightly")) for i in images)) or str(images),
    )


def _migrate_and_first_operator(checks: Checks, found: dict[str, Container], workdir: Path) -> None:
    def migrate():
        if "infercap-migrate" not in found:
            return "no migration Job (infercap-migrate) in the manifests"
        job = Pod(found["infercap-migrate"], workdir)
        job.start().wait(timeout=240)
        if job.proc.returncode != 0:
            return f"exit {job.proc.returncode}: {job.tail()}"
        left = job.exec(["python", "manage.py", "migrate", "--check", "--noinput"])
        return left.returncode == 0 or f"migrations left unapplied: {left.stdout[-300:]}{left.stderr[-300:]}"

    checks.run("the migration Job's command migrates with the production settings", migrate)

    def first_operator():
        web = Pod(found["infercap-web"], workdir / "exec")
        run = web.exec(FIRST_OPERATOR)
        if run.returncode != 0:
            return f"exit {run.returncode}: {run.stderr[-500:]}"
        password = re.search(r"password \(shown once\): (\S+)", run.stdout)
        user = User.objects.filter(username=FIRST_OPERATOR[4]).first()
        # The production settings' hasher (Django's default), which the test settings replace with a fast one.
        ok = (
            user is not None
            and user.is_operator
            and password
            and PBKDF2PasswordHasher().verify(password[1], user.password)
        )
        return bool(ok) or f"no operator with the printed password: {run.stdout[-300:]}"

    checks.run("the documented command creates the first operator", first_operator)


def _http_probe(pod: Pod, probe: dict) -> httpx.Response:
    http = probe["httpGet"]
    assert http["port"] in ("http", CONTAINER_PORT), http
    return pod.get(http["path"])


def _wait_probe(checks: Checks, pod: Pod, kind: str) -> bool:
    probe = pod.container.probes[kind]
    budget = min(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3), 150)
    response = until(lambda: _http_probe(pod, probe).status_code == 200 or None, budget)
    if response is not True:
        last = _http_probe(pod, probe) if pod.proc.poll() is None else None
        detail = f"{last.status_code} {last.text[:200]}" if last is not None else f"exited: {pod.tail()}"
        return checks.record(f"web {kind} {probe['httpGet']['path']} (Host {POD_IP})", False, detail)
    return checks.record(f"web {kind} {probe['httpGet']['path']} (Host {POD_IP})", True)


def _stream(pod: Pod, host: str, key: str, model: str):
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{pod.port}/v1/chat/completions", json=body, timeout=30,
                      headers={"Host": host, "Authorization": f"Bearer {key}"}) as response:  # fmt: skip
        text = "".join(response.iter_text())
    chunks = [line for line in text.splitlines() if line.startswith("data: {")]
    return (response.status_code == 200 and chunks and text.rstrip().endswith("data: [DONE]")) or (
        f"{response.status_code} {text[:300]}"
    )


def _web_checks(checks: Checks, web: Pod, world: dict) -> None:
    if not _wait_probe(checks, web, "startupProbe"):
        return
    _wait_probe(checks, web, "livenessProbe")
    _wait_probe(checks, web, "readinessProbe")
    stale = web.tmp / "prometheus" / "counter_4242.db"
    checks.run("the metrics directory exists, emptied of the last run's files",
               lambda: (stale.parent.is_dir() and not stale.exists()) or "missing, or the stale file is still there")  # fmt: skip
    host = web.env["DJANGO_ALLOWED_HOSTS"].split(",")[0]
    checks.run("other paths still refuse a Host outside ALLOWED_HOSTS",
               lambda: web.get("/api/v1/").status_code == 400 or web.get("/api/v1/").status_code)  # fmt: skip
    checks.run("other paths still redirect plain HTTP to https",
               lambda: web.get("/console/", host=host).headers.get("location", "").startswith("https://")
               or web.get("/console/", host=host).status_code)  # fmt: skip
    checks.run("a completion streams through the proxy", lambda: _stream(web, host, world["key"], world["model"]))
    token = {"Authorization": f"Bearer {web.env['INFERCAP_METRICS_TOKEN']}"}

    def counted() -> list[str]:
        text = web.get("/metrics", **token).text
        return [line for line in text.splitlines()
                if line.startswith("infercap_proxy_requests_total{") and f'endpoint="{world["model"]}"' in line]  # fmt: skip

    def proxy_metrics():
        # The proxy meters a request just after its last byte reached the client: the count may trail it a moment.
        deadline = time.monotonic() + 10.0
        while not (found := counted()) and time.monotonic() < deadline:
            time.sleep(0.2)
        counted_lines = found
        refused = web.get("/metrics").status_code
        return (bool(counted_lines) and refused == 404) or f"counted {counted_lines}, without the token {refused}"

    checks.run("/metrics with the token counts the completion (all workers)", proxy_metrics)
    checks.run("/metrics/platform with the token, Host the pod IP",
               lambda: f'endpoint="{world["model"]}"' in web.get("/metrics/platform", **token).text
               or web.get("/metrics/platform", **token).status_code)  # fmt: skip


def _docker_checks(checks: Checks, docker: Pod, image: Image) -> None:
    def healthcheck():
        run = until(lambda: docker.exec(image.healthcheck, timeout=10).returncode == 0 or None, 90, every=2)
        if run is True:
            return True
        last = docker.exec(image.healthcheck, timeout=10)
        return f"exit {last.returncode}: {last.stderr[-300:]} {docker.tail()[-300:]}"

    checks.run("the image's ENTRYPOINT + CMD serve and its HEALTHCHECK passes", healthcheck)


def _exec_probe(pod: Pod, timeout: float) -> bool | str:
    command = pod.container.probes["livenessProbe"]["exec"]["command"]
    run = until(lambda: pod.exec(command, timeout=30).returncode == 0 or None, timeout, every=2)
    if run is True:
        return True
    return f"{command[-1][:80]}: {pod.exec(command, timeout=30).stderr[-300:]} {pod.tail()[-300:]}"


def _control_loop_checks(checks: Checks, worker: Pod, beat: Pod, api: RecordingApiServer) -> None:
    checks.run("worker livenessProbe (celery inspect ping)", lambda: _exec_probe(worker, 90))
    checks.run("beat livenessProbe (schedule file fresh)", lambda: _exec_probe(beat, 60))
    called = until(lambda: any("/namespaces/infercap/" in path for _, path in api.requests), 60)
    checks.record("the worker scales through the Kubernetes API", called is True, f"API calls: {api.requests[:5]}")


def _start_pods(found, image: Image, secret: dict, workdir: Path, api: RecordingApiServer) -> dict[str, Pod]:
    pods = {
        "web": Pod(found["infercap-web"], workdir),
        # `docker run --env-file` with the Secret: the image's own ENV and defaults otherwise.
        "docker": Pod(Container(pod="docker", argv=image.entrypoint + image.cmd, env=image.env | secret), workdir),
        "worker": Pod(found["infercap-worker"], workdir, extra_env={"INFERCAP_KUBERNETES_API_URL": api.url}),
        "beat": Pod(found["infercap-beat"], workdir),
    }
    # A restarted container's emptyDir still holds the last run's metrics files.
    (pods["web"].tmp / "prometheus").mkdir()
    (pods["web"].tmp / "prometheus" / "counter_4242.db").write_bytes(b"stale")
    for pod in pods.values():
        pod.start()
    return pods


def run(*, secret: dict[str, str] | None = None, progress=print, overlay: str = OVERLAY) -> dict:
    """Boots the shipped package against this process's database and Redis; ``checks``, ``failures``, ``failed``."""
    if manifests.kubectl() is None:
        progress("kubectl not installed: production boot not run")
        return {"checks": None, "failures": None, "failed": ["kubectl (kustomize) not installed"]}
    started = time.monotonic()
    checks, image = Checks(progress), dockerfile_image()
    objects = manifests.render(overlay)
    secret = secret or default_secret()
    found = containers(objects, image, secret)
    _static_checks(checks, objects, image, found)
    pods: dict[str, Pod] = {}
    api = RecordingApiServer()
    with tempfile.TemporaryDirectory(prefix="infercap-boot-") as tmp, ProcessGroup() as procs:
        try:
            _migrate_and_first_operator(checks, found, Path(tmp))
            world = boot_world(procs)
            pods = _start_pods(found, image, secret, Path(tmp), api)
            _web_checks(checks, pods["web"], world)
            _docker_checks(checks, pods["docker"], image)
            _control_loop_checks(checks, pods["worker"], pods["beat"], api)
        finally:
            for pod in pods.values():
                pod.stop()
            api.close()
    return checks.summary() | {"seconds": round(time.monotonic() - started, 1)}


def bench(progress=print) -> dict:
    """``bench deploy``'s ``production_boot``: the boot on a throwaway database (needs PostgreSQL and Redis)."""
    if settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis:
        progress("production boot needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL): not run")
        return {"production_boot": {"checks": None, "failures": None}}
    progress("production boot: the prod overlay's containers with the production settings")
    with throwaway_database("boot", progress):
        result = run(progress=progress)
    progress(f"production boot: {result['checks']} checks, {result['failures']} failed")
    return {"production_boot": result}

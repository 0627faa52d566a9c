"""The shipped image and manifests as processes on this machine, for the production boot
(``benchmarks/operations/production_boot.py``, whose docstring says what is mapped from a pod to this machine):
the Dockerfile's final stage and each rendered container read as the runtime reads them, a ``Pod`` that starts one
container's command line with its environment, and a recording stand-in for the Kubernetes API server."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from capacity.runtimes.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
POD_IP = "10.42.0.17"  # what the kubelet puts in Host: the pod's address, never an allowed host
IMAGE_VENV = "/opt/venv"
CONTAINER_PORT = 8000


@dataclass
class Image:
    env: dict[str, str]
    user: str
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]


@dataclass
class Container:
    pod: str
    argv: list[str]
    env: dict[str, str]
    probes: dict[str, dict] = field(default_factory=dict)
    run_as_user: int | None = None


# -- the Dockerfile and the manifests, read as the runtime reads them ---------------------------------------------
def _exec_form(text: str) -> list[str]:
    return json.loads(text) if text.startswith("[") else ["/bin/sh", "-c", text]


def dockerfile_image(path: Path = ROOT / "Dockerfile") -> Image:
    """The final stage's ENV (in order, ``$VAR`` expanded), USER, ENTRYPOINT, CMD and HEALTHCHECK command."""
    text = re.sub(r"\\\n", " ", path.read_text())
    final = text[text.rindex("\nFROM ") :]
    env: dict[str, str] = {}
    found: dict[str, str] = {}
    for line in final.splitlines():
        instruction, _, args = line.strip().partition(" ")
        if instruction == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = re.sub(r"\$(\w+)", lambda m: env.get(m[1], f"${m[1]}"), value)
        elif instruction in ("USER", "ENTRYPOINT", "CMD", "HEALTHCHECK"):
            found[instruction] = args.strip()
    health = found["HEALTHCHECK"][found["HEALTHCHECK"].index("CMD ") + 4 :].strip()
    return Image(
        env=env,
        user=found["USER"],
        entrypoint=_exec_form(found["ENTRYPOINT"]) if "ENTRYPOINT" in found else [],
        cmd=_exec_form(found["CMD"]),
        healthcheck=_exec_form(health),
    )


def _argv(image: Image, spec: dict) -> list[str]:
    """Kubernetes' rule: ``command`` replaces the ENTRYPOINT (and drops CMD), ``args`` replaces CMD."""
    if "command" in spec:
        return list(spec["command"]) + list(spec.get("args", []))
    return image.entrypoint + list(spec.get("args", image.cmd))


def _env(image: Image, spec: dict, sources: dict[tuple[str, str], dict[str, str]]) -> dict[str, str]:
    env = dict(image.env)
    for ref in spec.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in ref else "Secret"
        env |= sources[(kind, (ref.get("configMapRef") or ref.get("secretRef"))["name"])]
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[var["name"]] = POD_IP
    return env


def containers(objects: list[dict], image: Image, secret: dict[str, str]) -> dict[str, Container]:
    """Each workload running the infercap image, by object name: Deployments and Jobs."""
    sources = {}
    for o in objects:
        if o["kind"] == "ConfigMap":
            sources[("ConfigMap", o["metadata"]["name"])] = dict(o.get("data", {}))
        elif o["kind"] == "Secret":
            sources[("Secret", o["metadata"]["name"])] = {**o.get("stringData", {}), **secret}
    found = {}
    for o in objects:
        if o["kind"] not in ("Deployment", "Job"):
            continue
        pod = o["spec"]["template"]["spec"]
        (spec,) = pod["containers"]
        if not spec["image"].startswith("infercap"):
            continue
        probes = {k: spec[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in spec}
        found[o["metadata"]["name"]] = Container(
            pod=o["metadata"]["name"],
            argv=_argv(image, spec),
            env=_env(image, spec, sources),
            probes=probes,
            run_as_user=pod.get("securityContext", {}).get("runAsUser"),
        )
    return found


# -- a pod on this machine ---------------------------------------------------------------------------------------
class Pod:
    """One container's process on this machine: its own /tmp, port 8000 mapped to a free one."""

    def __init__(self, container: Container, workdir: Path, *, extra_env: dict[str, str] | None = None) -> None:
        self.container = container
        self.tmp = workdir / container.pod / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.log = workdir / container.pod / "log"
        self.env = {k: self.local(v) for k, v in container.env.items()} | {
            "PATH": self.local(container.env.get("PATH", "")).replace("$PATH", os.environ.get("PATH", "")),
            "HOME": str(self.tmp),
            "HOSTNAME": socket.gethostname(),
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen | None = None

    def local(self, value: str) -> str:
        # The container's /tmp first, then its venv: this checkout (and so its venv) may itself lie under /tmp.
        value = re.sub(r"(?<![\w.])/tmp(?=/|$)", str(self.tmp), value)
        return value.replace(f"{IMAGE_VENV}/bin", str(Path(sys.executable).parent))

    def argv(self, argv: list[str]) -> list[str]:
        # The HEALTHCHECK's URL names the container port too.
        out = [self.local(a).replace(f"127.0.0.1:{CONTAINER_PORT}/", f"127.0.0.1:{self.port}/") for a in argv]
        return [
            str(self.port) if prev == "--port" and a == str(CONTAINER_PORT) else a
            for prev, a in zip(["", *out[:-1]], out, strict=True)
        ]

    def start(self) -> subprocess.Popen:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(self.container.argv), cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return self.proc

    def exec(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """As ``kubectl exec`` or an exec probe: the container's environment, not through the entrypoint."""
        return subprocess.run(self.argv(argv), cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)

    def get(self, path: str, *, host: str = f"{POD_IP}:{CONTAINER_PORT}", **headers) -> httpx.Response:
        return httpx.get(
            f"http://127.0.0.1:{self.port}{path}",
            headers={"Host": host, **headers},
            timeout=10,
            follow_redirects=False,
        )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(condition, timeout: float, every: float = 0.5):
    """``condition()``'s first truthy value within ``timeout``, else its last value (or the last exception)."""
    deadline, value = time.monotonic() + timeout, None
    while True:
        try:
            value = condition()
        except (httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
            value = exc
        if value and not isinstance(value, Exception):
            return value
        if time.monotonic() > deadline:
            return value if value is not None else False
        time.sleep(every)


# -- the Kubernetes API the worker's service account would reach ---------------------------------------------------
class RecordingApiServer:
    """Answers the calls the Kubernetes actuator makes for an endpoint with no pods yet, and records them."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        recorded = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                recorded.append((self.command, self.path))
                body, status = _api_answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _api_answer(path: str) -> tuple[dict, int]:
    path = path.split("?")[0]
    if path.endswith("/scale"):
        selector = "infercap/role=replica"
        return {"kind": "Scale", "spec": {"replicas": 0}, "status": {"replicas": 0, "selector": selector}}, 200
    if path.endswith("/pods"):
        return {"kind": "PodList", "items": []}, 200
    return {"kind": "Status", "message": f"{path} not found", "code": 404}, 404

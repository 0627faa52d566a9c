"""``python manage.py run_platform``: the whole platform in one terminal, for a laptop or a demo.

Starts the ASGI server (console, REST API and the OpenAI-compatible proxy), a Celery worker with an
embedded beat (the control loops), seeds the demo world, lets the autoscaler's actuator bring up the
demo endpoint's simulated replicas, then prints the URLs, logins and a curl example. Ctrl-C stops
every process it started, replicas included.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from capacity.autoscaling.actuators import get_actuator
from capacity.autoscaling.services import reconcile
from capacity.runtimes.processes import celery_worker_argv
from endpoints.models import Endpoint, Replica, ReplicaState


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run web + proxy, Celery worker and beat, and simulated replicas; print URLs and a curl example."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--endpoint", default="demo-chat")
        parser.add_argument("--replicas", type=int, default=2)
        parser.add_argument("--exit-after", type=float, default=0.0, help="stop after this many seconds (smoke tests)")

    def handle(self, *args, host, port, endpoint, replicas, exit_after, **options):
        # Ctrl-C, `kill` and a closed terminal all stop everything in order. SIGINT is set explicitly because a
        # shell starting us in the background hands it over ignored, and Python then never raises on it.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        self.children: list[subprocess.Popen] = []
        self.labels: list[str] = []
        self._say(f"backends: {settings.BACKENDS.describe()}")
        out = io.StringIO()
        call_command("seed_demo", endpoint=endpoint, replicas=replicas, as_json=True, stdout=out)
        demo = json.loads(out.getvalue().strip().splitlines()[-1])
        env = {**os.environ, "INFERCAP_QUIET": "1", "PYTHONUNBUFFERED": "1"}
        var_dir = settings.VAR_DIR
        var_dir.mkdir(parents=True, exist_ok=True)
        base = f"http://{host}:{port}"
        try:
            self._spawn(
                "web",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "config.asgi:application",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--no-access-log",
                    "--log-level",
                    "warning",
                    "--http",
                    "config.http_server:BoundedHttpToolsProtocol",  # as shipped: header and body time bounded
                ],
                env,
            )
            self._spawn("control loops", celery_worker_argv(var_dir / "celerybeat-schedule"), env)
            self._wait_http(f"{base}/healthz", "web server", timeout_s=60)
            self._bring_up_replicas(endpoint, timeout_s=90)
            self._banner(base, demo)
            started = time.monotonic()
            while True:
                for index, child in enumerate(self.children):
                    if child.poll() is None:
                        continue
                    if self.labels[index] == "web":
                        raise CommandError(f"the web server exited ({child.returncode})")
                    # kombu's Redis transport can end a worker on a dropped broker connection; restart it,
                    # as Kubernetes restarts the worker pod.
                    self._say(f"{self.labels[index]} exited ({child.returncode}); restarting it")
                    self.children[index] = subprocess.Popen(child.args, env=env, start_new_session=True)
                if exit_after and time.monotonic() - started > exit_after:
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            self._say("stopping")
        finally:
            self._shutdown()

    def _spawn(self, label: str, argv: list[str], env: dict) -> None:
        self._say(f"starting {label}: {' '.join(argv[1:4])} …")
        # Own process group, so Ctrl-C in the terminal reaches us once and we stop children in order.
        self.children.append(subprocess.Popen(argv, env=env, start_new_session=True))
        self.labels.append(label)

    def _wait_http(self, url: str, what: str, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        self._say(f"{what} is up")
                        return
            except OSError:
                time.sleep(0.3)
        raise CommandError(f"{what} did not answer {url} within {timeout_s:.0f} s")

    def _bring_up_replicas(self, endpoint_name: str, *, timeout_s: float) -> None:
        endpoint = Endpoint.objects.get(name=endpoint_name)
        self._say(f"starting {endpoint.min_replicas} simulated replica(s) for {endpoint.name} (local actuator)")
        reconcile(endpoint=endpoint)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = Replica.objects.filter(endpoint=endpoint, state=ReplicaState.READY, is_standby=False).count()
            if ready >= max(1, endpoint.min_replicas):
                self._say(f"{ready} replica(s) ready")
                return
            time.sleep(1)
            reconcile(endpoint=endpoint)
        raise CommandError(f"no ready replica for {endpoint.name} within {timeout_s:.0f} s")

    def _banner(self, base: str, demo: dict) -> None:
        curl = (
            f"curl -N {base}/v1/chat/completions \\\n"
            f"  -H 'Authorization: Bearer {demo['api_key']}' -H 'Content-Type: application/json' \\\n"
            f'  -d \'{{"model": "{demo["endpoint"]}", "stream": true, "max_tokens": 32, '
            f'"messages": [{{"role": "user", "content": "Hello!"}}]}}\''
        )
        self.stdout.write(
            "\n"
            "infercap is running\n"
            f"  console        {base}/console/   (operator: {demo['operator']} / {demo['password']}, "
            f"tenant: {demo['tenant_admin']} / {demo['password']})\n"
            f"  REST API docs  {base}/api/docs/\n"
            f"  OpenAPI schema {base}/api/schema/\n"
            f"  admin          {base}/admin/\n"
            f"  proxy          {base}/v1/  (OpenAI-compatible; model = {demo['endpoint']})\n"
            f"  metrics        {base}/metrics  (-H 'Authorization: Bearer {settings.INFERCAP.get('METRICS_TOKEN', '')}')\n"
            f"  API key        {demo['api_key']}  (shown once)\n\n"
            f"try it:\n{curl}\n\n"
            "Ctrl-C stops everything.\n"
        )
        self.stdout.flush()

    def _shutdown(self) -> None:
        # The control loops stop first: a reconcile tick that ran after the replicas were stopped would launch a
        # replacement that nothing stops (a CI run under load left one behind).
        for child in reversed(self.children):
            if child.poll() is None:
                # The main process only: Celery's warm shutdown stops its own pool (a group-wide SIGTERM makes
                # every pool process die noisily mid-task).
                child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        for endpoint in Endpoint.objects.all():
            live = list(endpoint.replicas.exclude(state__in=[ReplicaState.STOPPED]))
            if live:
                try:
                    get_actuator(endpoint).terminate(live, reason="run_platform stopped")
                except Exception as exc:  # keep stopping the rest
                    self._say(f"could not stop replicas of {endpoint.name}: {exc}")
        self._say("stopped")

    def _say(self, message: str) -> None:
        self.stderr.write(f"[infercap] {message}")

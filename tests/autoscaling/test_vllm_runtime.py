"""The ``vllm`` runtime as the platform runs it, without the engine: the command line in both forms, which one a
host gets, the model directory, the environment, and the local actuator starting a stand-in engine interpreter
(readiness from GET /health, the cold start recorded, the engine's process group stopped). The real engine:
tests/engine/test_local_replica.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.local import LocalActuator, pid_alive, replica_argv
from capacity.runtimes import vllm
from capacity.runtimes.launch_env import vllm_engine_env
from capacity.runtimes.launch_options import tenant_launch_option_errors
from endpoints.models import Endpoint, Replica, ReplicaState
from endpoints.validation import launch_option_errors
from tests.factories import ModelProfileFactory
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


# -- the command line and the launcher ---------------------------------------------------------------------------
def test_module_form_has_the_console_forms_flags_with_the_model_in_a_flag():
    console = vllm.serve_command(model="m", port=8001, served_model_name="chat", max_num_seqs=8)
    module = vllm.serve_command(model="m", port=8001, served_model_name="chat", max_num_seqs=8, python="/e/python")
    assert console[:3] == ["vllm", "serve", "m"]
    assert module[:5] == ["/e/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert console[3:] == module[5:]  # the same flags after the model
    assert vllm.argv_model(console) == vllm.argv_model(module) == "m"


def test_the_launcher_takes_the_operators_choice_then_the_engine_interpreter_then_the_console_script(monkeypatch):
    assert vllm.launcher(python="/e/python", executable="/opt/vllm") == {"executable": "/opt/vllm"}
    assert vllm.launcher(python="/e/python", executable=None) == {"python": "/e/python"}
    monkeypatch.setattr(vllm.shutil, "which", lambda name: "/usr/bin/vllm")
    assert vllm.launcher(python=None, executable=None) == {"executable": "vllm"}
    # No console script, but this interpreter imports vllm: module form from it.
    monkeypatch.setattr(vllm.shutil, "which", lambda name: None)
    monkeypatch.setattr(vllm.importlib.util, "find_spec", lambda name: object())
    assert vllm.launcher(python=None, executable=None) == {"python": sys.executable}
    monkeypatch.setattr(vllm.importlib.util, "find_spec", lambda name: None)
    assert vllm.launcher(python=None, executable=None) == {"executable": "vllm"}  # the launch says it is missing


def test_the_engine_interpreter_is_the_configured_one_else_the_engine_venvs_when_it_exists(tmp_path):
    default = tmp_path / "python"
    assert vllm.engine_python("/opt/engine/bin/python", default=default) == "/opt/engine/bin/python"
    assert vllm.engine_python("", default=default) is None
    default.write_text("")
    assert vllm.engine_python("", default=default) == str(default)


def test_a_profile_names_a_model_directory_only_inside_the_operators_models_dir(tmp_path):
    (tmp_path / "tiny-llama").mkdir()
    (tmp_path / "secret").mkdir()
    assert vllm.model_argument("tiny-llama", models_dir=tmp_path) == str(tmp_path / "tiny-llama")
    assert vllm.model_argument("tiny-llama", models_dir=None) == "tiny-llama"
    assert vllm.model_argument("meta-llama/Llama-2-13b-hf", models_dir=tmp_path) == "meta-llama/Llama-2-13b-hf"
    for name in ("../secret", "tiny-llama/../secret", ".", ".."):  # no traversal out of (or within) the dir
        assert vllm.model_argument(name, models_dir=tmp_path / "tiny-llama") == name
    assert vllm.model_argument("/srv/models/x", models_dir=tmp_path) == "/srv/models/x"  # as the profile says


# -- the environment ------------------------------------------------------------------------------------------
def test_a_vllm_replica_is_offline_and_silent_by_default_and_binds_no_cores_unless_told():
    env = vllm.serve_env({"cpus": 2})
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "2"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # vLLM's own default unless the operator sizes it
    told = vllm.serve_env({"cpus": 4, "cpuset": "0-3", "offline": False, "cpu_kvcache_gib": 1.5})
    assert told["VLLM_CPU_OMP_THREADS_BIND"] == "0-3" and told["VLLM_CPU_KVCACHE_SPACE"] == "1.5"
    assert "HF_HUB_OFFLINE" not in told and told["VLLM_NO_USAGE_STATS"] == "1"


@pytest.mark.parametrize(
    ("options", "message"),
    [({"cpu_kvcache_gib": 0}, "cpu_kvcache_gib"), ({"cpu_kvcache_gib": "4"}, "cpu_kvcache_gib"),
     ({"offline": "yes"}, "offline")],
)  # fmt: skip
def test_bad_engine_options_are_refused_before_any_launch(options, message):
    with pytest.raises(ValueError, match=message):
        vllm_engine_env(options)
    assert any(message in error for error in launch_option_errors(options, runtime="vllm"))


def test_a_replica_inherits_none_of_the_platforms_settings_or_credentials():
    environ = {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "DATABASE_URL": "postgres://u:pw@db/x",
        "REDIS_URL": "redis://r", "DJANGO_SECRET_KEY": "s", "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "INFERCAP_METRICS_TOKEN": "t", "CELERY_BROKER_URL": "amqp://", "PYTHONPATH": "/work/main",
        "VIRTUAL_ENV": "/work/main/.venv",
    }  # fmt: skip
    assert vllm.engine_base_env(environ) == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}


# -- the local actuator with a stand-in engine interpreter ----------------------------------------------------
STAND_IN = """\
#!{python}
# Stands in for the engine interpreter: records how it was started, starts a child (vLLM's engine core), opens the
# port at once and answers /health 503 until the test creates the 'healthy' file (vLLM loading its model).
import json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
record = {{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "child": child.pid}}
open({record!r} + ".part", "w").write(json.dumps(record))
os.replace({record!r} + ".part", {record!r})  # whole or absent: the test polls for it
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        status = 200 if os.path.exists({healthy!r}) else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Handler).serve_forever()
"""


@pytest.fixture
def stand_in(tmp_path, settings):
    """A stand-in engine interpreter, configured as INFERCAP["VLLM_PYTHON"], and a models dir with the profile."""
    script = tmp_path / "engine-python"
    paths = {"record": str(tmp_path / "record.json"), "healthy": str(tmp_path / "healthy")}
    script.write_text(STAND_IN.format(python=sys.executable, **paths))
    script.chmod(0o755)
    models = tmp_path / "models"
    (models / "tiny-llama").mkdir(parents=True)
    settings.INFERCAP = {**settings.INFERCAP, "VLLM_PYTHON": str(script), "VLLM_MODELS_DIR": str(models)}
    return {"script": script, "models": models, **{k: Path(v) for k, v in paths.items()}}


def vllm_endpoint(tenant, **options) -> Endpoint:
    Endpoint.objects.filter(pk=tenant.endpoint.pk).update(
        runtime="vllm",
        model_profile=ModelProfileFactory(name="tiny-llama", parameters_b=0.003, weights_gb=0.01),
        launch_options={"actuator": "local", "cpus": 1, **options},
    )
    return Endpoint.objects.get(pk=tenant.endpoint.pk)


@pytest.mark.django_db(transaction=True)
def test_the_local_actuator_runs_the_engine_interpreter_outside_the_repo_without_the_platforms_env(
    tenant_a, stand_in, reap_local_replicas
):
    endpoint = vllm_endpoint(tenant_a)
    (replica,) = LocalActuator().launch(endpoint, 1)
    record = json.loads(wait_for(lambda: stand_in["record"].exists() and stand_in["record"].read_text(), 30))
    argv = record["argv"]
    # Module form from the engine interpreter, serving the profile's directory under the endpoint's name.
    assert argv[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", str(stand_in["models"] / "tiny-llama")]
    assert argv[argv.index("--served-model-name") + 1] == endpoint.name
    assert "--enable-prompt-tokens-details" in argv and argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert Path(record["cwd"]).resolve() != ROOT  # not where `python -m` would import this repository's packages
    env = record["env"]
    assert not {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "REDIS_URL"} & set(env)
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert replica.state == ReplicaState.STARTING

    # The port is open but /health is not 200 yet (the model is loading): not ready.
    actuator = LocalActuator()
    port = int(argv[argv.index("--port") + 1])
    wait_for(lambda: _answers(port), 30)
    actuator.sync(endpoint)
    assert Replica.objects.get(pk=replica.pk).state == ReplicaState.STARTING
    # /health 200: ready, with the cold start in the transition.
    stand_in["healthy"].touch()
    actuator.sync(endpoint)
    replica.refresh_from_db()
    assert replica.state == ReplicaState.READY
    reason = replica.transitions.get(to_state=ReplicaState.READY).reason
    assert reason.startswith("health check passed: cold start ") and reason.endswith(" s")

    # Stopping it stops its process group: the engine core child goes too.
    actuator.terminate([replica], reason="test")
    assert not pid_alive(int(replica.actuator_ref))
    wait_for(lambda: not _running(record["child"]), 10)


def _answers(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 503
    except httpx.HTTPError:
        return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.django_db
def test_without_an_engine_the_launch_says_how_to_install_one_and_starts_nothing(tenant_a, settings, tmp_path):
    settings.INFERCAP = {**settings.INFERCAP, "VLLM_PYTHON": str(tmp_path / "no-engine" / "python")}
    endpoint = vllm_endpoint(tenant_a)
    with pytest.raises(ActuatorError, match="make engine"):
        LocalActuator().launch(endpoint, 1)
    assert not Replica.objects.filter(endpoint=endpoint).exists()


@pytest.mark.django_db
def test_an_operator_may_name_the_interpreter_per_endpoint_and_it_passes_the_argv_checks(tenant_a, stand_in):
    endpoint = vllm_endpoint(tenant_a, python="/opt/engine-b/bin/python")
    assert replica_argv(endpoint, port=8001)[:2] == ["/opt/engine-b/bin/python", "-m"]
    endpoint.launch_options["python"] = "-c"
    with pytest.raises(ValueError, match="python"):
        replica_argv(endpoint, port=8001)
    assert tenant_launch_option_errors({"python": "/x"}) == ["only operators may set python"]


@pytest.mark.django_db
def test_an_embedding_endpoint_launches_the_pooling_runner():
    pooling = vllm.serve_command(model="m", port=8001, runner="pooling")
    assert pooling[pooling.index("--runner") + 1] == "pooling"
    assert "--runner" not in vllm.serve_command(model="m", port=8001)  # vLLM's own default: generate
    with pytest.raises(ValueError):
        vllm.serve_command(model="m", port=8001, runner="embed; rm -rf /")
    assert tenant_launch_option_errors({"runner": "pooling"}) == []
    assert tenant_launch_option_errors({"runner": "transcription"})
    endpoint = Endpoint(
        name="e", model_profile=ModelProfileFactory(), runtime="vllm", launch_options={"runner": "pooling"}
    )
    argv = replica_argv(endpoint, port=9000)
    assert argv[argv.index("--runner") + 1] == "pooling"
    sim = Endpoint(name="e", model_profile=endpoint.model_profile, runtime="sim", launch_options={"runner": "pooling"})
    sim_argv = replica_argv(sim, port=9000)
    assert sim_argv[sim_argv.index("--runner") + 1] == "pooling"

"""A replica's thread pools follow its CPU allotment, not the host's core count: the pure computation, the vLLM
environment, a real simulated replica process, the local actuator's processes and the Kubernetes pod template."""

import json
import os
from pathlib import Path

import httpx
import pytest
import yaml

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.kubernetes import KubernetesActuator
from capacity.autoscaling.actuators.local import LocalActuator, stop_pid
from capacity.runtimes import launch_env as le
from capacity.runtimes import vllm
from endpoints.models import Endpoint, Replica
from simulator.process import start_replica
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def big_host(monkeypatch):
    """This process appears to run on a 192-vCPU host with every core in its affinity and no cgroup quota."""
    monkeypatch.setattr(os, "cpu_count", lambda: 192)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(192)), raising=False)
    monkeypatch.setattr(le, "cgroup_cpu_quota", lambda *a, **k: None)


def environ_of(pid: int) -> dict[str, str]:
    """The environment the process was started with, once it has exec'd (until then a forked child shows this
    process's command line and initial environment)."""
    ours = Path("/proc/self/cmdline").read_bytes()

    def state() -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]

    def execd() -> bool:
        # An empty command line is a process mid-exec (not yet the new program's environment either: a fresh-clone
        # CI run read this process's initial environment after one) or one that already exited (a zombie).
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        return (bool(cmdline) and cmdline != ours) or state() == "Z"

    wait_for(execd, 10, message="the replica's exec")
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    # A process that already exited (a zombie until reaped) shows an empty command line and environment: say so
    # rather than fail on a missing variable (one CI run saw that once, cause unknown: the replica's log was empty).
    assert state() != "Z", f"the replica (pid {pid}) exited before its environment could be read"
    return env


# --- the pure computation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, cpus",
    [
        ({"cpus": 12}, 12.0),
        ({"cpu_allotment": "12"}, 12.0),
        ({"cpus": "1500m"}, 1.5),
        ({"resources": {"limits": {"cpu": "8"}, "requests": {"cpu": "4"}}}, 8.0),
        ({"resources": {"requests": {"cpu": "250m"}}}, 0.25),
        ({"profile": "tiny"}, None),
        (None, None),
    ],
)
def test_allotment_is_read_from_the_launch_options(options, cpus):
    assert le.cpu_allotment(options) == cpus


@pytest.mark.parametrize("bad", [0, -2, "lots", "12 cores", True, float("nan"), [4], "0m"])
def test_a_bad_allotment_is_refused_with_the_reason(bad):
    with pytest.raises(ValueError, match="CPU"):
        le.cpu_allotment({"cpus": bad})


def test_twelve_cores_allotted_on_a_192_vcpu_host_give_twelve_threads(big_host):
    env = le.launch_env({"cpus": 12})
    assert {env[name] for name in le.THREAD_VARS} == {"12"}
    assert env["TOKENIZERS_PARALLELISM"] == "true" and env["INFERCAP_CPU_ALLOTMENT"] == "12"
    # A fractional allotment rounds down (1.5 cores must not run 2 busy threads), never to zero
    assert le.launch_env({"cpus": "1500m"})["OMP_NUM_THREADS"] == "1"
    assert le.launch_env({"cpus": "100m"})["TOKENIZERS_PARALLELISM"] == "false"


def test_without_an_allotment_the_process_affinity_and_cgroup_quota_rule_not_the_core_count(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "cpu_count", lambda: 192)
    assert le.launch_env({}, affinity={0, 1, 2, 3}, quota=None)["OMP_NUM_THREADS"] == "4"
    assert le.launch_env({}, affinity=set(range(192)), quota=6.0)["OMP_NUM_THREADS"] == "6"
    # cgroup v2 cpu.max: "<quota> <period>", or "max" for none
    (tmp_path / "cpu.max").write_text("1200000 100000\n")
    assert le.cgroup_cpu_quota(tmp_path) == 12.0
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert le.cgroup_cpu_quota(tmp_path) is None
    assert le.cgroup_cpu_quota(tmp_path / "absent") is None


def test_vllm_tensor_parallel_workers_share_the_allotment(big_host):
    assert vllm.serve_env({"cpus": 16, "tensor_parallel_size": 4})["OMP_NUM_THREADS"] == "4"
    assert vllm.serve_env({"cpus": 2, "tensor_parallel_size": 8})["OMP_NUM_THREADS"] == "1"
    # vLLM's CPU backend binds its OpenMP threads to the named cores
    assert vllm.serve_env({"cpus": 12, "cpuset": "0-11"})["VLLM_CPU_OMP_THREADS_BIND"] == "0-11"
    with pytest.raises(ValueError, match="cpuset"):
        vllm.serve_env({"cpus": 12, "cpuset": "all of them"})
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        vllm.serve_env({"cpus": 12, "tensor_parallel_size": 0})


# --- real processes ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ")
def test_a_spawned_simulated_replica_gets_its_allotment_not_the_parents_setting(monkeypatch):
    # The parent was started with a host-sized pool; the replica must not inherit it
    monkeypatch.setenv("OMP_NUM_THREADS", "192")
    with start_replica(profile="tiny", speed=50, cpus=3) as replica:
        env = environ_of(replica.pid)
        assert replica.healthy()
    assert {env[name] for name in le.THREAD_VARS} == {"3"}
    assert env["INFERCAP_CPU_ALLOTMENT"] == "3"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ")
def test_the_local_actuator_starts_replicas_with_the_endpoint_allotment(db, tenant_a, big_host, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "192")
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        launch_options={"actuator": "local", "profile": "tiny", "speed": 50, "cpus": "12"}
    )
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    actuator = LocalActuator()
    (replica,) = actuator.launch(endpoint, 1)
    pid = int(replica.actuator_ref)
    try:
        env = environ_of(pid)
    finally:
        stop_pid(pid, grace_s=2.0)
    assert {env[name] for name in le.THREAD_VARS} == {"12"}


def test_the_local_actuator_refuses_a_bad_allotment_before_starting_anything(db, tenant_a):
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={"actuator": "local", "cpus": "-3"})
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    with pytest.raises(ActuatorError, match="CPU amount"):
        LocalActuator().launch(endpoint, 1)
    assert not Replica.objects.filter(endpoint=endpoint).exists()


# --- Kubernetes --------------------------------------------------------------------------------------------------

DEPLOY_PATH = "/apis/apps/v1/namespaces/infer/deployments/llama-13b"


class Cluster:
    """Just enough API server: the scale subresource and deployment patches, every request recorded."""

    def __init__(self, replicas: int):
        self.replicas = replicas
        self.requests: list[tuple[str, str, str, dict | None]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, request.headers.get("Content-Type", ""), body))
        if request.url.path == DEPLOY_PATH + "/scale":
            if request.method == "PATCH":
                self.replicas = body["spec"]["replicas"]
            return httpx.Response(
                200, json={"spec": {"replicas": self.replicas}, "status": {"selector": "infercap.io/endpoint=x"}}
            )
        if request.url.path == DEPLOY_PATH and request.method == "PATCH":
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"message": "not found"})


def kube_endpoint(tenant, **options):
    Endpoint.objects.filter(pk=tenant.endpoint.pk).update(
        runtime="vllm",
        launch_options={"actuator": "kubernetes", "namespace": "infer", "deployment": "llama-13b", **options},
    )
    return Endpoint.objects.get(pk=tenant.endpoint.pk)


def test_kubernetes_scale_from_zero_sets_the_pod_cpu_limit_and_threads_from_the_allotment(db, tenant_a, big_host):
    cluster = Cluster(replicas=0)
    k8s = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(cluster.handle))
    k8s.launch(kube_endpoint(tenant_a, cpus=12, tensor_parallel_size=2), 1)
    # It reads the template first (what an earlier launch placed there goes), then patches it once
    patches = [r for r in cluster.requests if r[1] == DEPLOY_PATH and r[0] == "PATCH"]
    assert len(patches) == 1
    _, _, content_type, body = patches[0]
    assert content_type == "application/strategic-merge-patch+json"
    (container,) = body["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vllm"
    assert container["resources"] == {"requests": {"cpu": "12000m"}, "limits": {"cpu": "12000m"}}
    env = {e["name"]: e for e in container["env"]}
    assert {env[name]["value"] for name in le.THREAD_VARS} == {"6"}  # two tensor-parallel workers share 12 cores
    assert all("valueFrom" in e and e["valueFrom"] is None for e in env.values())  # replaces the template's refs
    assert cluster.replicas == 1  # the template was patched before any pod existed


def test_kubernetes_never_patches_a_template_with_pods_running_or_without_an_allotment(db, tenant_a):
    running = Cluster(replicas=2)
    k8s = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(running.handle))
    k8s.launch(kube_endpoint(tenant_a, cpus=12), 3)  # a template change would roll the running pods
    assert running.replicas == 3 and not [r for r in running.requests if r[1] == DEPLOY_PATH]
    idle = Cluster(replicas=0)
    k8s = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(idle.handle))
    k8s.launch(kube_endpoint(tenant_a), 1)
    assert idle.replicas == 1 and not [r for r in idle.requests if r[1] == DEPLOY_PATH and r[0] == "PATCH"]
    with pytest.raises(ActuatorError, match="CPU"):
        KubernetesActuator(
            api_url="https://k8s.test", token="t", transport=httpx.MockTransport(Cluster(0).handle)
        ).launch(kube_endpoint(tenant_a, cpus="twelve"), 1)


def test_the_replica_template_sizes_every_pool_from_its_own_cpu_limit():
    doc = yaml.safe_load((REPO / "platform" / "kubernetes" / "base" / "vllm-replica.yaml").read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e.get("valueFrom", {}).get("resourceFieldRef") for e in container["env"]}
    assert set(le.THREAD_VARS) <= set(refs)
    for name in le.THREAD_VARS:
        assert refs[name] == {"containerName": container["name"], "resource": "limits.cpu", "divisor": "1"}
    # Without a CPU limit, limits.cpu resolves to the node's allocatable CPUs: the limit must be set
    limit = le.parse_cpu_quantity(container["resources"]["limits"]["cpu"])
    assert limit == le.parse_cpu_quantity(container["resources"]["requests"]["cpu"])

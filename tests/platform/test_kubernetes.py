"""The Kubernetes package (platform/kubernetes: kustomize base, dev and prod overlays) renders, every object it
renders is valid against the Kubernetes API's schemas, and the vLLM replica template agrees with the actuator
that scales it and with the command line the platform builds for vLLM."""

import re
import shutil
import subprocess

import pytest
import yaml

from capacity.autoscaling.actuators.kubernetes_objects import ROLE, deployment_name, standby_deployment_name
from capacity.runtimes.vllm import serve_command
from endpoints.models import Endpoint
from workers import manifests

pytestmark = pytest.mark.skipif(manifests.kubectl() is None, reason="kubectl (kustomize) not installed")


@pytest.fixture(scope="module")
def rendered() -> dict[str, manifests.Validation]:
    return manifests.validate_all()


def _by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_rendered_object_is_valid(rendered):
    for overlay, result in rendered.items():
        assert result.invalid == [], overlay
        kinds = sorted(o["kind"] for o in result.objects)
        assert kinds.count("Deployment") == 4 and kinds.count("PodDisruptionBudget") == 3
        assert kinds.count("NetworkPolicy") == 3
        assert {"Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret"} <= set(kinds)
        assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds)


def test_the_validation_catches_a_wrong_field():
    web = _by_kind(manifests.render("base"), "Deployment")["infercap-web"]
    web["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {"name": "http"}
    assert manifests.validate(web) is not None
    web["spec"]["replica"] = 2  # strict: an unknown field
    assert manifests.validate(web) is not None
    monitor = _by_kind(manifests.render("base"), "ServiceMonitor")["infercap-web"]
    monitor["spec"]["endpoints"][0]["interval"] = "soon"
    assert manifests.validate(monitor) is not None


def test_overlays_set_namespace_image_and_scale(rendered):
    for overlay, namespace, tag, web_replicas in (("overlays/dev", "infercap-dev", "dev", 1),
                                                  ("overlays/prod", "infercap", "0.1.0", 3)):  # fmt: skip
        objects = rendered[overlay].objects
        cluster_scoped = ("Namespace", "ClusterRole", "ClusterRoleBinding")
        namespaced = [o for o in objects if o["kind"] not in cluster_scoped]
        assert {o["metadata"].get("namespace") for o in namespaced} == {namespace}
        (binding,) = _by_kind(objects, "ClusterRoleBinding").values()
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "infercap-autoscaler", "namespace": namespace}
        ]
        assert binding["metadata"]["name"].endswith(namespace), "two installs in one cluster keep both bindings"
        assert namespace in _by_kind(objects, "Namespace"), "created by the same apply"
        assert _by_kind(objects, "Job")["infercap-migrate"]["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
            "python", "manage.py", "migrate"]  # fmt: skip
        deployments = _by_kind(objects, "Deployment")
        assert deployments["infercap-web"]["spec"]["replicas"] == web_replicas
        for name in ("infercap-web", "infercap-worker", "infercap-beat"):
            (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
            assert container["image"] == f"infercap:{tag}"
    prod_pdb = _by_kind(rendered["overlays/prod"].objects, "PodDisruptionBudget")["infercap-web"]
    assert prod_pdb["spec"]["minAvailable"] == 2


def test_platform_pods_run_as_the_images_user_with_probes_and_resources(rendered):
    uid = int(re.search(r"--uid (\d+)", (manifests.ROOT / "Dockerfile").read_text())[1])
    for name, deployment in _by_kind(rendered["overlays/prod"].objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["resources"]["requests"] and container["resources"]["limits"].get("memory"), name
        assert "livenessProbe" in container, name
        if name != "infercap-ep-ENDPOINT_ID":  # vLLM's image
            assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == uid
            assert container["securityContext"]["readOnlyRootFilesystem"]
    web = _by_kind(rendered["overlays/prod"].objects, "Deployment")["infercap-web"]
    assert web["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"


def _flags(argv: list[str]) -> list[str]:
    """`--flag value` and `--flag=value` alike, as `--flag=value`."""
    out, i = [], 0
    while i < len(argv):
        if "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def test_the_replica_template_is_what_the_actuator_and_the_command_line_expect(rendered):
    template = _by_kind(rendered["base"].objects, "Deployment")["infercap-ep-ENDPOINT_ID"]
    endpoint = Endpoint(pk=7, name="chat", launch_options={})
    name = template["metadata"]["name"].replace("ENDPOINT_ID", str(endpoint.pk))
    assert name == deployment_name(endpoint)
    assert standby_deployment_name(endpoint) == f"{name}-standby"
    selector = template["spec"]["selector"]["matchLabels"]
    pod_labels = template["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items() and selector[ROLE] == "replica", "promotion relabels this"
    assert template["spec"]["replicas"] == 0, "the autoscaler owns the count"
    (container,) = template["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vllm" and container["ports"] == [{"containerPort": 8000, "name": "http"}]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    model, *flags = container["args"]
    want = serve_command(model="MODEL", port=8000, served_model_name="ENDPOINT_NAME", gpu_memory_utilization=0.9,
                         max_num_seqs=128)  # fmt: skip
    assert model == "MODEL" and want[:3] == ["vllm", "serve", "MODEL"]
    assert sorted(_flags(flags)) == sorted(_flags(want[3:])), "vLLM takes its flags in any order"


def test_the_role_grants_what_the_actuator_calls(rendered):
    role = _by_kind(rendered["base"].objects, "Role")["infercap-autoscaler"]
    grants = {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    needed = {("deployments", v) for v in ("get", "create", "delete", "patch")}
    needed |= {("deployments/scale", v) for v in ("get", "patch")} | {("pods", v) for v in ("list", "patch", "delete")}
    assert needed <= grants
    # The room task (docs/placement.md, "In the ledger"): every node and every namespace's pods.
    room = _by_kind(rendered["base"].objects, "ClusterRole")["infercap-autoscaler-room"]
    assert {("nodes", "list"), ("pods", "list")} <= {(r, v) for rule in room["rules"] for r in rule["resources"]
                                                     for v in rule["verbs"]}  # fmt: skip
    (binding,) = _by_kind(rendered["base"].objects, "ClusterRoleBinding").values()
    assert binding["roleRef"]["name"] == room["metadata"]["name"]
    assert binding["subjects"][0]["name"] == role["metadata"]["name"]
    worker = _by_kind(rendered["base"].objects, "Deployment")["infercap-worker"]
    assert worker["spec"]["template"]["spec"]["serviceAccountName"] == role["metadata"]["name"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_prometheus_rule_loads_in_promtool(rendered, tmp_path):
    (rule,) = _by_kind(rendered["base"].objects, "PrometheusRule").values()
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_ingress_example_is_valid_and_routes_to_the_web_service(rendered):
    (ingress,) = yaml.safe_load_all((manifests.KUSTOMIZE_DIR / "examples" / "ingress.yaml").read_text())
    assert manifests.validate(ingress) is None
    service = _by_kind(rendered["base"].objects, "Service")["infercap-web"]
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    config = _by_kind(rendered["base"].objects, "ConfigMap")["infercap"]
    assert rule["host"] in config["data"]["DJANGO_ALLOWED_HOSTS"].split(",")

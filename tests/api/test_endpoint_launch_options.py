"""Launch options are an allowlist for tenants, the served model comes from the model profile, and no value can put
a flag into a replica's argv."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from capacity.autoscaling.actuators.local import replica_argv
from capacity.runtimes.launch_options import argv_value, tenant_launch_option_errors
from capacity.runtimes.vllm import argv_model
from endpoints.models import Endpoint
from endpoints.services import endpoint_update
from tests.factories import EndpointFactory, HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db

DANGEROUS = [
    {"model": "--trust-remote-code"},
    {"model": "/etc/shadow"},
    {"model": "attacker/poisoned-weights"},
    {"tensor_parallel_size": 8},
    {"gpu_memory_utilization": 1.0},
    {"dtype": "float32"},
    {"executable": "/bin/sh"},
    {"extra_args": ["--trust-remote-code"]},
    {"host": "0.0.0.0"},
    {"port": 22},
    {"faults": {"crash_after_s": 1}},
    {"cpuset": "0-63"},
    {"resources": {"limits": {"nvidia.com/gpu": 8}}},
    {"some_future_flag": True},
]


def _payload(options: dict, runtime: str = "vllm") -> dict:
    return {
        "name": "launch-probe",
        "model_profile": ModelProfileFactory().pk,
        "hardware_profile": HardwareProfileFactory().pk,
        "runtime": runtime,
        "launch_options": options,
    }


@pytest.mark.parametrize("options", DANGEROUS, ids=lambda o: next(iter(o)))
def test_tenant_is_refused_each_option_outside_the_allowlist(world, options):
    mine = world.a.endpoint
    for who in ("a_admin", "a_write_key"):
        client = world.client(who)
        created = client.post(reverse("endpoint-list"), _payload(options), format="json")
        assert created.status_code == 400, (who, created.content)
        assert "only operators may set" in str(created.json()["launch_options"])
        patched = client.patch(reverse("endpoint-detail", args=[mine.pk]), {"launch_options": options}, format="json")
        assert patched.status_code == 400, (who, patched.content)
    assert not Endpoint.objects.filter(name="launch-probe").exists()
    mine.refresh_from_db()
    assert mine.launch_options == {}


@pytest.mark.parametrize(
    "options",
    [
        {"speed": -1},
        {"speed": "fast"},
        {"max_num_seqs": 10**9},
        {"max_num_seqs": "--max-num-seqs=1"},
        {"scheduling_policy": "lifo"},
        {"block_size": 7},
        {"profile": "-h"},
        {"profile": "tiny --fault crash=1"},
        {"profile_opts": {"--x": 1}},
        {"profile_opts": {"x": "a b"}},
        {"enable_prefix_caching": "yes"},
    ],
)
def test_allowlisted_options_are_checked_by_type_and_range(world, options):
    response = world.client("a_admin").post(reverse("endpoint-list"), _payload(options, runtime="sim"), format="json")
    assert response.status_code == 400, response.content
    assert "launch_options" in response.json()


def test_tenant_tunes_allowlisted_options_and_keeps_operator_values(world):
    ok = world.client("a_admin").post(
        reverse("endpoint-list"),
        _payload({"max_num_seqs": 128, "scheduling_policy": "fcfs", "enable_prefix_caching": False}),
        format="json",
    )
    assert ok.status_code == 201, ok.content
    endpoint = Endpoint.objects.get(pk=ok.json()["id"])
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options={**endpoint.launch_options, "cpus": 4})
    resent = {**endpoint.launch_options, "cpus": 4, "max_num_seqs": 64}
    patched = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[endpoint.pk]), {"launch_options": resent}, format="json"
    )
    assert patched.status_code == 200, patched.content
    dropped = {k: v for k, v in resent.items() if k != "cpus"}
    refused = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[endpoint.pk]), {"launch_options": dropped}, format="json"
    )
    assert refused.status_code == 400 and "cpus" in str(refused.json())


def test_services_apply_the_allowlist_to_tenant_principals(world):
    with pytest.raises(ValidationError) as refused:
        endpoint_update(endpoint=world.a.endpoint, actor=world.a.admin, launch_options={"model": "-x"})
    assert "only operators may set model" in str(refused.value)


def test_model_is_not_a_launch_option_even_for_operators(world):
    response = world.client("operator").post(reverse("endpoint-list"), _payload({"model": "x"}), format="json")
    assert response.status_code == 400
    assert "model profile" in str(response.json()["launch_options"])


# -- argv ------------------------------------------------------------------------------------------------------
def test_a_hostile_stored_model_value_cannot_inject_a_flag():
    """A row written before the allowlist (or in SQL) with a flag for a model: the argv serves the model profile,
    as one element, and the hostile value appears nowhere."""
    endpoint = EndpointFactory(
        runtime="vllm",
        model_profile=ModelProfileFactory(name="llama-13b"),
        launch_options={"model": "--trust-remote-code", "max_num_seqs": 32},
    )
    argv = replica_argv(endpoint, port=8001)
    assert argv_model(argv) == "llama-13b"  # `vllm serve llama-13b` or `python -m ... --model llama-13b`
    assert "--trust-remote-code" not in argv
    assert argv[argv.index("--served-model-name") + 1] == endpoint.name
    assert argv[argv.index("--max-num-seqs") + 1] == "32"


@pytest.mark.parametrize(
    "options",
    [
        {"dtype": "--trust-remote-code"},
        {"dtype": "auto\x00--x"},
        {"max_num_seqs": "8 --enforce-eager"},
        {"executable": "-c"},
        {"extra_args": ["ok", "\x00"]},
    ],
)
def test_hostile_values_stored_for_vllm_never_reach_argv(options):
    endpoint = EndpointFactory.build(runtime="vllm", launch_options=options)  # PostgreSQL would refuse the NULs
    with pytest.raises(ValueError):
        replica_argv(endpoint, port=8001)


def test_sim_argv_checks_each_value():
    endpoint = EndpointFactory(runtime="sim", launch_options={"profile": "-h"})
    with pytest.raises(ValueError):
        replica_argv(endpoint, port=8001)
    fine = EndpointFactory(runtime="sim", launch_options={"profile": "tiny", "profile_opts": {"max_num_seqs": 4}})
    argv = replica_argv(fine, port=8001)
    assert argv[argv.index("--profile") + 1] == "tiny" and "max_num_seqs=4" in argv


def test_argv_value_and_the_allowlist_are_pure_checks():
    assert argv_value("n", 3) == "3" and argv_value("n", "bf16") == "bf16"
    for bad in ("-x", "a b", "a\tb", "", "a\x00", None, ["x"], {"a": 1}, True):
        with pytest.raises(ValueError):
            argv_value("n", bad)
    assert tenant_launch_option_errors({"speed": 2}) == []
    assert tenant_launch_option_errors({"cpus": 4}, current={"cpus": 4}) == []
    assert tenant_launch_option_errors({}, current={"cpus": 4}) == ["only operators may set cpus"]


def test_a_nul_in_launch_options_is_a_field_error_not_a_500(world):
    for options in ({"deployment": "a\x00b"}, {"x\x00": 1}):
        response = world.client("operator").post(reverse("endpoint-list"), _payload(options), format="json")
        assert response.status_code == 400, response.content
        assert "launch_options" in response.json()

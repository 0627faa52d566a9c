"""The console's P/D planner page: both designs for bench pd's long RAG and short chat, and field errors."""

from django.urls import reverse

from capacity.models import HardwareProfile


def _defaults(client):
    form = client.get(reverse("console:planner-pd")).context["form"]
    return {name: field.initial for name, field in form.fields.items() if field.initial is not None}


def test_long_rag_is_disaggregated_and_short_chat_is_not(client, operator):
    client.force_login(operator)
    url = reverse("console:planner-pd")
    data = _defaults(client)
    rag = client.post(url, data)
    assert rag.status_code == 200
    plan = rag.context["result"]
    assert plan.recommended == "disaggregated" and plan.disaggregated_gpus < plan.aggregated.gpus
    page = rag.content.decode()
    assert "Recommended: disaggregated" in page and "Disaggregation pays" in page
    chat = {**data, "arrival_rate_per_s": 40, "input_tokens": 576, "input_tokens_sd": 259, "output_tokens": 160}
    chat = client.post(url, {**chat, "ttft_s": 1, "tpot_ms": 50})
    assert chat.status_code == 200 and chat.context["result"].recommended == "aggregated"
    assert "recommend aggregated" in chat.content.decode()


def test_field_errors_and_a_hardware_profile_without_a_link(client, operator):
    client.force_login(operator)
    url = reverse("console:planner-pd")
    data = _defaults(client)
    bad = client.post(url, {**data, "arrival_rate_per_s": -1, "engine_profile": "nope", "tpot_ms": ""})
    assert bad.status_code == 400
    assert {"arrival_rate_per_s", "engine_profile", "tpot_ms"} <= set(bad.context["form"].errors)
    hw = HardwareProfile.objects.create(name="no-link", gpu_type="H100", gpu_memory_gb=80, memory_bandwidth_gbps=3350)
    no_link = client.post(url, {**data, "hardware_profile": hw.pk})
    assert no_link.status_code == 400 and "hardware_profile" in no_link.context["form"].errors

"""The console's planner chooses the TP size and says which topology it assumed."""

from django.urls import reverse


def _defaults(client):
    form = client.get(reverse("console:planner")).context["form"]
    return {name: field.initial for name, field in form.fields.items() if field.initial is not None}


def test_a_model_too_big_for_one_gpu_is_planned_at_tp_2_with_its_topology(client, operator):
    client.force_login(operator)
    url = reverse("console:planner")
    data = {**_defaults(client), "weights_gb": 79}
    # One 80 GB GPU leaves 80 − 79 − 10 < 0 GB for KV: without choosing the TP size it is a field error.
    assert client.post(url, data).status_code == 400
    response = client.post(url, {**data, "choose_tp": "on"})
    assert response.status_code == 200
    choice, result = response.context["tp"], response.context["result"]
    # TP 2: 160 − 79 − 20 = 61 GB of KV; the step halves, so TP 2 needs no more GPUs than TP 4 or 8.
    assert choice.chosen == 2 and result.feasible
    by_tp = {c.tp: c for c in choice.candidates}
    assert not by_tp[1].fits_memory and by_tp[2].kv_gb == 61
    assert by_tp[2].gpus == min(c.gpus for c in choice.candidates if c.gpus is not None)
    page = response.content.decode()
    assert "Topology assumed: 8 GPUs per node, NVLink domains of 8 GPUs; a replica of 2 GPUs" in page
    assert 'id="plan-tp"' in page and "(chosen)" in page


def test_the_topology_says_when_the_replica_does_not_fit_a_domain(client, operator):
    client.force_login(operator)
    data = {**_defaults(client), "gpus_per_replica": 4, "interconnect_domain_gpus": 2}
    response = client.post(reverse("console:planner"), data)
    assert response.status_code == 200 and response.context["tp"] is None
    assert not response.context["topology"]["fits"]
    assert "does not fit (no interconnect domain holds a group of 4 GPUs)" in response.content.decode()

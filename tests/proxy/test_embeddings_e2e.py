"""/v1/embeddings through a real proxy worker to a simulated pooling replica (simulator/embeddings.py, vLLM's
shapes): routed, limited and metered like completions; refused in OpenAI's shape where the request or the model
does not fit; and a generating endpoint says it serves no embeddings."""

import openai
import pytest

from billing.models import UsageRecord
from capacity.unit_resolver import endpoint_coefficients
from capacity.units import request_mu
from tenants.models import ApiKey
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import assert_openai_error, post, wait_usage
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_embeddings_are_routed_limited_and_metered(procs, clean_redis, tenant_a, tenant_b):
    endpoint = EndpointFactory(name="a-embedder", owner_tenant=tenant_a.tenant)
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint)
    spawn_replica(procs, endpoint=endpoint, name="pool-1", extra=["--runner", "pooling"])
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="gen-1")
    base = spawn_proxy(procs)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=tenant_a.raw_key, max_retries=0)
    answer = client.embeddings.create(model="a-embedder", input=["the first text", "and a second"])
    assert answer.model == "a-embedder" and [d.index for d in answer.data] == [0, 1]
    assert len(answer.data[0].embedding) == 256 and answer.usage.completion_tokens == 0
    [record] = wait_usage(1, endpoint=endpoint)
    assert (record.status, record.input_tokens, record.output_tokens) == ("ok", answer.usage.prompt_tokens, 0)
    coeffs = endpoint_coefficients(endpoint)
    assert record.mu == pytest.approx(request_mu(coeffs, answer.usage.prompt_tokens, 0, 0), rel=1e-6)
    assert record.tenant_id == tenant_a.tenant.pk and record.api_key_id == tenant_a.key.pk

    def refused(body, status, param=None):
        err = assert_openai_error(post(base, tenant_a.raw_key, body, path="/v1/embeddings"), status)
        assert param is None or err["param"] == param, err
        return err

    refused({"model": "a-embedder", "input": ""}, 400, "input")
    refused({"model": "a-embedder", "input": [1, "x"]}, 400, "input")
    refused({"model": "a-embedder", "input": "hi", "stream": True}, 400, "stream")
    refused({"model": "a-embedder", "input": "hi", "encoding_format": "hex"}, 400, "encoding_format")
    refused({"model": "a-embedder", "input": "hi", "kv_transfer_params": {"do_remote_prefill": True}}, 400)
    refused({"model": "b-model", "input": "hi"}, 404, "model")  # another tenant's model is a missing one
    # The engine's own refusal (not a Matryoshka model) reaches the client as it said it.
    assert refused({"model": "a-embedder", "input": "hi", "dimensions": 8}, 400)["message"].startswith("Model")
    # A generating endpoint has no embeddings route: OpenAI's shape, not FastAPI's {"detail": …}.
    err = refused({"model": tenant_a.endpoint.name, "input": "hi"}, 404)
    assert err["code"] == "unsupported_api" and "/v1/embeddings" in err["message"]
    # The key's controls hold here as on completions.
    ApiKey.objects.filter(pk=tenant_a.key.pk).update(allowed_models=[tenant_a.endpoint.name])
    endpoint.save()  # republish the snapshot
    answered = []  # until the proxy has the new snapshot, a poll is still served (and billed)

    def refused_now() -> bool:
        status = post(
            base, tenant_a.raw_key, {"model": "a-embedder", "input": "hi"}, path="/v1/embeddings"
        ).status_code
        answered.append(status)
        return status == 403

    wait_for(refused_now, timeout=15, message="the allowlist")
    assert set(answered[:-1]) <= {200}
    # Every answered embedding is billed once, none of the refused ones.
    wait_usage(1 + answered.count(200), endpoint=endpoint, status="ok")
    assert UsageRecord.objects.filter(endpoint=endpoint, status="ok").count() == 1 + answered.count(200)

"""LoRA adapter tasks: refresh each adapter's request rate from the usage records (docs/lora.md#routing).

Thin: ``endpoints.adapters.adapter_rates_refresh`` does the work; the proxies read the rates with their snapshot.
"""

from celery import shared_task

from endpoints.adapters import adapter_rates_refresh


@shared_task(name="adapters.rates_refresh", soft_time_limit=50, time_limit=58)
def rates_refresh() -> int:
    return adapter_rates_refresh()


BEAT_SCHEDULE = {
    "adapters-rates-refresh": {"task": "adapters.rates_refresh", "schedule": 300.0, "options": {"expires": 290}},
}

"""The OpenAI-compatible streaming proxy (the data plane).

Run it as part of the platform's ASGI app (``config.asgi``; ``config.routing`` sends ``/v1/`` and ``/metrics``
here and everything else to Django), e.g. ``uvicorn config.asgi:application --loop uvloop --http httptools``.
With several worker processes set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before start-up so
``/metrics`` aggregates all of them. Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` (Bearer tenant key) and ``GET /metrics``.

Request path (``app.py`` dispatches, ``pipeline.py`` runs the named stages of ``stages.py`` on one ``flight.Flight``):
authenticate the key against the in-process snapshot (``snapshot.py``, no database query per request) → parse
(``request.py``) → price (MU estimate, ``capacity.units``) → limit (``limits.py``) → admit, routing the request
(``runtime.py`` over the pure ``gateway.admission`` and ``gateway.routing``) → relay over one pooled aiohttp
session per process (``relay.py``) → meter (``metering.py``: ``billing.ingest`` and ``metrics.py``). Every response
carries ``x-request-id`` (also the usage record's ``request_id``).

Priority: the reservation's class capped by the key's ``max_priority``; a request may lower it with the header
``x-infercap-priority: critical|standard|sheddable``. Without a reservation a tenant runs as sheddable.

Knobs (``settings.INFERCAP["PROXY"]`` or ``INFERCAP_PROXY_<NAME>`` environment variables, see ``config.py``):
``max_queue`` per endpoint and process, ``max_age_{critical,standard,sheddable}_s`` (queue-age shedding),
``ttft_timeout_s`` and ``idle_timeout_s`` (no total timeout), ``max_body_bytes``. The replica metrics
scrape interval is ``INFERCAP_PROXY_SCRAPE_INTERVAL_S`` (default 0.1 s); a replica is scraped while requests
consider it (``scrape_idle_s``, 30 s) and at most ``scrape_budget_per_s`` (1,000) scrapes start a second.

Redis is used for four things, and each degrades on its own when Redis is unreachable:

* **Rate limits** (reserved MU/min bucket, RPM, TPM) are shared across proxy processes through Redis.
  With ``INFERCAP["RATE_LIMIT_FAIL_MODE"] = "open"`` (the default) each process falls back to its own
  in-memory buckets with the same limits, so a tenant may get up to N× its limits across N processes
  while Redis is down, but never unlimited traffic; with ``"closed"`` the proxy answers 503 with
  ``Retry-After: 1`` instead. A failed Redis call trips a 1-second breaker so requests do not each
  pay a connect timeout.
* **Config snapshot version** polling: while Redis is down the proxy re-reads its snapshot from
  PostgreSQL every few seconds instead, so admin edits still arrive, only slower.
* **Demand reports** for the autoscaler and the console (``infercap:demand:{endpoint_id}``) pause; the
  autoscaler treats missing reports as no data.
* **Usage spool**: usage records that cannot reach PostgreSQL go to a Redis stream, or, when Redis is
  down too, to a local spool file; both are drained into PostgreSQL when it is back.

* **Replica slots are shared between proxy processes**: each process heartbeats its membership and its demand
  per replica into ``infercap:proxy:members`` every ``member_interval_s`` (0.25 s), and holds
  a part of every replica's concurrency limit (``gateway.admission.shares``: parts follow demand, critical first,
  the rest split evenly; the script grants only what the other live processes do not hold, so the parts never sum
  above the limit and N processes never send a replica more than its limit together). No Redis call per request:
  the caps change only on heartbeats. Costs: a new process queues its first requests for about one interval; a dead
  process's part is idle until its entry expires (``member_ttl_s``, 1.5 s); with more processes than a replica's
  limit some processes get no slot on it. While Redis is unreachable every process keeps its last caps (a replica
  it was never granted anything of gets its even share); without Redis configured, or before its first heartbeat
  reached Redis, a process has the whole limits.

Known limits: queues are per process (admission order and fairness hold within a process, not across
processes); a process whose event loop stalls past ``member_ttl_s`` is counted out by the others while its
streams still run.
"""

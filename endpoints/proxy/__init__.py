"""The OpenAI-compatible streaming proxy (the data plane).

Mounted by ``config.routing`` for ``/v1/`` and ``/metrics``; see ``endpoints.proxy.app`` for the request path.

Redis is used for three things, and each degrades on its own when Redis is unreachable:

* **Rate limits** (reserved MU/min bucket, RPM, TPM) are shared across proxy processes through Redis.
  With ``INFERCAP["RATE_LIMIT_FAIL_MODE"] = "open"`` (the default) each process falls back to its own
  in-memory buckets with the same limits, so a tenant may get up to N× its limits across N processes
  while Redis is down, but never unlimited traffic; with ``"closed"`` the proxy answers 503 with
  ``Retry-After: 1`` instead. A failed Redis call trips a 1-second breaker so requests do not each
  pay a connect timeout.
* **Config snapshot version** polling: while Redis is down the proxy re-reads its snapshot from
  PostgreSQL every few seconds instead, so admin edits still arrive, only slower.
* **Usage spool**: usage records that cannot reach PostgreSQL go to a Redis stream, or, when Redis is
  down too, to a local spool file; both are drained into PostgreSQL when it is back.
"""

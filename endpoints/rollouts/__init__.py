"""Endpoint versions and zero-downtime rollouts: ``machine`` (pure decisions), ``services`` (writes and the tick),
``selectors`` (traffic weights for the proxy, per-version request outcomes)."""

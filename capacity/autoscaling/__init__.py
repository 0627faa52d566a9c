"""Two-axis autoscaling: replica count (horizontal) and per-replica concurrency (vertical).

Pure (no Django; shared with the simulator): ``demand`` (samples, windows), ``horizontal``, ``vertical``,
``predictive`` (floor in MU from history days, or in requests from yesterday, and the trend), ``baselines`` (static,
HPA-like, KPA-like, the cron-style scheduled pre-scale), ``oracle`` (the bound that knows the test day), ``two_axis`` (our
policies as one stateful object for simulations), ``sim_adapter`` (any of these policies on the shared engine
simulator's autoscaler hook and the in-flight time model that ``bench autoscale`` runs on), ``fleetsim`` (the
autoscaler's own lighter fleet model), ``traces`` (the bursty trace; the seeded day generator of held-out days),
``replica_metrics`` (vLLM /metrics → p95s, gauges). Both simulations admit through the proxy's
``gateway.admission``.
Django side: ``actuators`` (``get_actuator(endpoint)``: local, kubernetes, static), ``services`` (decision ticks,
reconcile, drains, warm pool), ``pins`` (operators' manual scales, held until they expire), ``store`` (Redis: demand, windows, tick locks), ``activator`` (scale from zero).
"""

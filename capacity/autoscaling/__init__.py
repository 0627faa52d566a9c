"""Two-axis autoscaling: replica count (horizontal) and per-replica concurrency (vertical).

Pure (no Django; shared with the simulator): ``demand`` (samples, windows), ``horizontal``, ``vertical``,
``predictive`` (floor from yesterday and the trend), ``baselines`` (static, HPA-like, KPA-like), ``infercap`` (our
policies as one stateful object for simulations), ``fleetsim`` (discrete-event fleet for ``bench autoscale``),
``traces`` (the bursty trace), ``replica_metrics`` (vLLM /metrics → p95s, gauges), ``sim_adapter`` (any of these
policies on the engine simulator's autoscaler hook).
Django side: ``actuators`` (``get_actuator(endpoint)``: local, kubernetes, static), ``services`` (decision ticks,
reconcile, drains, warm pool), ``store`` (Redis: demand, windows, tick locks), ``activator`` (scale from zero).
"""

"""The automatic benchmark of one replica (``manage.py benchmark_replica``, the ``CapacityBenchmark`` rows):
``sweep`` is the closed-loop load sweep and the model-unit fit (pure), ``http_driver`` drives a live replica over
HTTP, ``sim_driver`` drives the simulator's engine in virtual time. ``bench`` figures live in ``benchmarks/capacity/``.
"""

"""The simulated vLLM runtime: one engine model, two clocks (pure except ``server``/``process``/``cli``).

- ``tokens``: the tokenizer (4 characters = 1 token), chat template, deterministic output text, block hashes.
- ``profiles``: engine constants by name (default ``llama-13b-a100``; the GPU profiles' step times come from
  ``roofline``: datasheet bandwidth and FLOPs, docs/algorithms.md#the-roofline);
  ``calibration`` measures a profile's per-stream decode rate and fits one to a real replica's benchmark runs.
- ``kvcache`` + ``engine``: continuous batching, KV blocks, prefix caching, priority queue, preemption.
- ``des`` (+ ``fleet``, ``interfaces``): the virtual-time discrete-event runner driving real routers,
  admission and autoscalers; ``admission``: the proxy's admission (``gateway.admission``) behind its hook;
  ``results``: per-request and per-replica records.
- ``workloads``: arrival processes and request shapes shared by benchmarks and tests.
- ``server`` (+ ``protocol``, ``metrics``): the real-time aiohttp replica speaking vLLM's HTTP API;
  ``faults``: hang, crash, slow, error rate, mid-stream failure, startup delay;
  ``cli``/``process``: run it as a process (``manage.py run_replica`` or ``python -m ...cli``) and start it from tests.
"""

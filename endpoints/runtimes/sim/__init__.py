"""The simulated vLLM runtime: one engine model, two clocks (pure except ``server``/``process``/``cli``).

- ``tokens``: the tokenizer (4 characters = 1 token), chat template, deterministic output text, block hashes.
- ``profiles``: engine constants by name (default ``llama-13b-a100``, fitted to the worked example's 13B table,
  docs/algorithms.md#simulator-engine-profiles);
  ``calibration`` measures a profile's per-stream decode rate.
- ``kvcache`` + ``engine``: continuous batching, KV blocks, prefix caching, priority queue, preemption.
- ``des`` (+ ``fleet``, ``interfaces``): the virtual-time discrete-event runner driving real routers,
  admission and autoscalers; ``admission``: the proxy's admission (``endpoints.admission``) behind its hook;
  ``results``: per-request and per-replica records.
- ``workloads``: arrival processes and request shapes shared by benchmarks and tests.
- ``server`` (+ ``protocol``, ``metrics``): the real-time aiohttp replica speaking vLLM's HTTP API;
  ``faults``: hang, crash, slow, error rate, mid-stream failure, startup delay;
  ``cli``/``process``: run it as a process (``manage.py run_replica`` or ``python -m ...cli``) and start it from tests.
"""

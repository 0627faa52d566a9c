"""The simulated vLLM runtime: one engine model, two clocks (pure except ``server``/``process``).

- ``tokens``: the tokenizer (4 characters = 1 token), chat template, deterministic output text, block hashes.
- ``profiles``: engine constants by name (default ``llama-13b-a100``, fitted to DESIGN.md's 13B table).
- ``kvcache`` + ``engine``: continuous batching, KV blocks, prefix caching, priority queue, preemption.
- ``des``: the virtual-time discrete-event runner driving real routers, admission and autoscalers.
- ``workloads``: arrival processes and request shapes; ``results``: per-request and per-replica records.
- ``server``: the real-time aiohttp replica speaking vLLM's HTTP API; ``process``: start it for tests.
- ``faults``: hang, crash, slow, error rate, startup delay.
"""

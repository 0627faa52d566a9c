"""Replica runtimes: how a replica process is started — real vLLM (``vllm.py``) or the simulator (``sim/``)."""

"""The data plane: the OpenAI-compatible proxy in front of the replicas, with its admission (priority queues,
shedding, backpressure) and routing (load in model units, prefix-cache affinity, bounded load) policies, and the
feeds that keep its view of the replicas fresh. It runs as its own process (docs/architecture.md)."""

"""The capacity planner: ``barriers`` is the pure three-barrier model (no Django), ``inputs`` builds its inputs
from stored endpoints, profiles and benchmarks (docs/algorithms.md#capacity-planner)."""

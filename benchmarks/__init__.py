"""The lab's benchmarks: every ``bench`` suite, its workloads, baselines, oracles and plots, and the security and
reliability harnesses. It may import anything; no product module imports it (pyproject.toml, contract "lab")."""

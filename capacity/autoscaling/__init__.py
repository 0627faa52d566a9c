"""Two-axis autoscaling: pure policies (horizontal, vertical, predictive floor, baselines), actuators and the
services that run one decision tick for an endpoint."""

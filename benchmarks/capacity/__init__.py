"""The ``bench`` command's capacity figures: ``bench planner`` (``planner``) and ``bench autoscale``
(``autoscale``). The replica benchmark that fits model units is ``capacity.replica_benchmark``."""

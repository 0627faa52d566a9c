from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    """Installed by the local and test settings only, for its ``bench`` command; production settings leave it out."""

    name = "benchmarks"

"""The beat schedule: the union of ``BEAT_SCHEDULE`` dicts declared by the modules in workers.tasks."""

from config.discovery import import_submodules
from workers import tasks  # noqa: F401  (imports every task module)


def beat_schedule() -> dict:
    schedule: dict = {}
    for module in import_submodules("workers.tasks"):
        schedule.update(getattr(module, "BEAT_SCHEDULE", {}))
    return schedule

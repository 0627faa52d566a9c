"""``python manage.py export_observability [--check]``: write the Grafana dashboard and the Prometheus Operator
objects of platform/ from workers/observability.py; ``--check`` fails if the committed files differ."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers.observability import rendered_files


class Command(BaseCommand):
    help = "Write platform/grafana/infercap.json and platform/kubernetes/base/monitoring.yaml from code."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="fail if the files in platform/ are out of date")

    def handle(self, *args, check=False, **options):
        stale = []
        for relative, text in rendered_files().items():
            path = Path(settings.BASE_DIR) / relative
            if check:
                if not path.is_file() or path.read_text() != text:
                    stale.append(relative)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.stdout.write(f"wrote {relative}")
        if stale:
            raise CommandError(f"out of date (run python manage.py export_observability): {', '.join(stale)}")

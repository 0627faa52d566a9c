"""``python manage.py run_replica --runtime sim|vllm --port P [...]``: run one model replica in the foreground.

``sim`` serves the simulated vLLM replica (``endpoints.runtimes.sim``) and prints ``READY http://host:port``
once it listens; ``vllm`` execs the ``vllm serve`` command built by ``endpoints.runtimes.vllm`` (GPU hosts only).
SIGTERM/SIGINT stop it cleanly. The same command line without Django: ``python -m endpoints.runtimes.sim.cli``.
"""

from django.core.management.base import BaseCommand, CommandError

from endpoints.runtimes.sim import cli


class Command(BaseCommand):
    help = "Run one model replica: the simulated vLLM (--runtime sim) or real vLLM (--runtime vllm)."
    requires_system_checks = []

    def add_arguments(self, parser):
        cli.add_arguments(parser)

    def handle(self, *args, **opts):
        try:
            cli.run(opts)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

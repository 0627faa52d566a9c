"""``python manage.py run_replica --runtime sim|vllm --port P [...]``: run one model replica in the foreground.

``vllm`` execs the ``vllm serve`` command built by ``capacity.runtimes.vllm`` (GPU hosts, or the CPU build).
``sim`` serves the simulated vLLM replica, which is the lab's (``simulator/``, docs/architecture.md): the command
hands its whole command line to ``python -m simulator.cli``, which prints ``READY http://host:port`` once it listens
and takes the simulator's own options (``--profile``, ``--speed``, ``--fault``...; ``--help`` lists them). Either way
the process is replaced, so SIGTERM/SIGINT reach the replica itself and stop it cleanly.
"""

import argparse
import os
import shutil
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from capacity.runtimes import vllm

SIMULATOR_CLI = "simulator.cli"  # run as a program, never imported: the product does not import the lab


def _runtime(args: list[str]) -> str:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--runtime", default="sim")
    return parser.parse_known_args(args)[0].runtime


def exec_simulator(args: list[str]) -> None:
    """Replace this process with the simulated replica's command line (the repository on its import path)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(settings.BASE_DIR), os.environ.get("PYTHONPATH")])),
    }
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", SIMULATOR_CLI, *args], env)


class Command(BaseCommand):
    help = "Run one model replica: real vLLM (--runtime vllm) or the simulated vLLM (--runtime sim, the default)."
    requires_system_checks = []

    def run_from_argv(self, argv):
        if _runtime(argv[2:]) == "sim":
            exec_simulator(argv[2:])
        super().run_from_argv(argv)

    def add_arguments(self, parser):
        parser.add_argument("--runtime", choices=["sim", "vllm"], default="sim")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--model", default=None, help="model path or Hugging Face id")
        parser.add_argument("--served-model-name", default=None)
        parser.add_argument("--max-num-seqs", type=int, default=None)
        parser.add_argument("--gpu-memory-utilization", type=float, default=None)
        parser.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="priority")

    def handle(self, *args, runtime, model, **opts):
        if runtime == "sim":
            raise CommandError("the simulated replica runs as its own program: python -m simulator.cli [options]")
        if not model:
            raise CommandError("--runtime vllm needs --model")
        try:
            argv = vllm.serve_command(
                model=model,
                port=opts["port"],
                host=opts["host"],
                served_model_name=opts["served_model_name"],
                max_num_seqs=opts["max_num_seqs"],
                gpu_memory_utilization=opts["gpu_memory_utilization"],
                scheduling_policy=opts["scheduling_policy"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if shutil.which(argv[0]) is None:
            raise CommandError(f"{argv[0]!r} is not installed here: real vLLM runs on GPU hosts (pip install vllm)")
        sys.stdout.flush()
        os.execvp(argv[0], argv)

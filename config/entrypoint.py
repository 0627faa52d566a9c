"""The image's entrypoint (``python -m config.entrypoint COMMAND...``): prepares what the image's processes
expect on disk, then becomes ``COMMAND``. Today that is ``PROMETHEUS_MULTIPROC_DIR``, created and emptied
(``config.metrics_dir``); the Kubernetes manifests give only ``args`` so that it runs in every pod."""

import os
import sys

from config.metrics_dir import metrics_dir_reset


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m config.entrypoint COMMAND [ARGS...]")
    metrics_dir_reset()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])

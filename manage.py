#!/usr/bin/env python
"""Django's command-line utility for infercap."""

import os
import sys

from django.core.management import execute_from_command_line


def main() -> None:
    # Unset means production, which refuses to start without its secrets: a forgotten variable on a server must
    # not quietly run with DEBUG on and a published secret key. Development says so (make run does).
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

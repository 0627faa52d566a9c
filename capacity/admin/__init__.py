"""Django admin for the capacity app: one module per feature, all imported here."""

from config.discovery import import_submodules

import_submodules(__name__)

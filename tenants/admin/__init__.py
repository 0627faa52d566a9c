"""Django admin for the tenants app: one module per feature, all imported here."""

from config.discovery import import_submodules

import_submodules(__name__)

"""Django admin for the endpoints app: one module per feature, all imported here."""

from config.discovery import import_submodules

import_submodules(__name__)

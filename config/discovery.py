"""Import every submodule of a package, so features add files instead of editing shared registries."""

import importlib
import pkgutil
from types import ModuleType


def import_submodules(package_name: str) -> list[ModuleType]:
    package = importlib.import_module(package_name)
    modules = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "urls":
            continue
        modules.append(importlib.import_module(f"{package_name}.{info.name}"))
    return modules

"""The proxy's code stays readable in one pass: no function in ``gateway/proxy/`` is over 60 lines (split it
into named steps instead), and an import inside a function says why it is not at the top (a real cycle or a heavy
import deferred) in a comment right above it."""

import ast
from pathlib import Path

import gateway.proxy

PROXY_DIR = Path(gateway.proxy.__file__).parent
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST):
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def long_functions(name: str, source: str) -> list[str]:
    return [
        f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in _functions(ast.parse(source))
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def unexplained_imports(name: str, source: str) -> list[str]:
    lines = source.splitlines()
    found = []
    for function in _functions(ast.parse(source)):
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not lines[node.lineno - 2].strip().startswith("#"):
                found.append(f"{name}:{node.lineno} in {function.name}")
    return found


def _proxy_modules() -> list[tuple[str, str]]:
    modules = [(path.name, path.read_text()) for path in sorted(PROXY_DIR.glob("*.py"))]
    assert len(modules) > 10 and "app.py" in dict(modules)  # the glob found the package
    return modules


def test_no_function_in_the_proxy_is_over_60_lines():
    assert [found for name, source in _proxy_modules() for found in long_functions(name, source)] == []


def test_imports_inside_proxy_functions_say_why():
    assert [found for name, source in _proxy_modules() for found in unexplained_imports(name, source)] == []


def test_the_checks_catch_a_long_function_and_an_unexplained_import():
    fits = "def fits():\n    # Deferred: heavy.\n    import json\n" + "    x = 1\n" * 57  # 60 lines
    assert long_functions("m.py", fits) == [] and unexplained_imports("m.py", fits) == []
    too_long = "async def too_long():\n    import json\n" + "    x = 1\n" * 59  # 61 lines
    assert long_functions("m.py", too_long) == ["m.py:1 too_long (61 lines)"]
    assert unexplained_imports("m.py", too_long) == ["m.py:2 in too_long"]

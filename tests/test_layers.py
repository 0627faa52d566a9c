"""The shape of the house (docs/architecture.md), read from the tree: the product never imports the lab, no app
holds more than 35 % of the product's lines, no product file is over 600 lines, no import cycle (type-checking imports
included), every product module in an import-linter contract and the simulator built on the pure policies only; and
the shape of the code: no import hidden in a function without its reason, every task a service enqueues by name
exists, no function longer than a screen. The contracts themselves are import-linter's (``[tool.importlinter]`` in
pyproject.toml); ``make lint`` runs both."""

import ast
import re
import tomllib
from pathlib import Path

import grimp

from config.celery_app import app as celery_app

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("billing", "capacity", "config", "console", "endpoints", "gateway", "placement", "tenants", "workers")
LAB = ("benchmarks", "simulator")
PACKAGES = PRODUCT + LAB
MAX_APP_SHARE = 0.35
MAX_PRODUCT_FILE_LINES = 600
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _package_files(packages) -> list[Path]:
    return [p for package in packages for p in sorted((ROOT / package).rglob("*.py")) if "migrations" not in p.parts]


def _source_files() -> list[Path]:
    return [ROOT / "manage.py", *sorted((ROOT / "scripts").glob("*.py")), *_package_files(PACKAGES)]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imported(path: Path) -> set[str]:
    """Every module name an import in ``path`` mentions, at the top, in a function or under TYPE_CHECKING, and for
    ``from a import b`` both ``a`` and ``a.b``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_product_never_imports_the_lab():
    # Given every product module, then none imports the simulator or the benchmarks, even inside a function (the
    # product runs the simulated replica as a program, ``python -m simulator.cli``, and never imports it).
    found = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in _package_files(PRODUCT)
        for name in _imported(path)
        if name.split(".")[0] in LAB
    )
    assert found == []


def test_no_app_holds_more_than_a_third_of_the_product():
    lines = {app: sum(_lines(p) for p in _package_files([app])) for app in PRODUCT}
    total = sum(lines.values())
    assert total > 20_000  # the walk found the product
    over = {app: f"{n / total:.0%}" for app, n in lines.items() if n > MAX_APP_SHARE * total}
    assert over == {}, "split the app by what its parts do (docs/architecture.md)"


def test_no_product_file_is_over_600_lines():
    over = {str(p.relative_to(ROOT)): _lines(p) for p in _package_files(PRODUCT) if _lines(p) > MAX_PRODUCT_FILE_LINES}
    assert over == {}, "split these modules by what their parts do"


def _contract_modules() -> set[str]:
    named = set()
    for contract in CONTRACTS:
        for key in ("layers", "source_modules", "modules"):
            for entry in contract.get(key, []):
                named |= {m.strip() for m in re.split(r"[|:]", entry) if m.strip()}
    return named


def test_every_product_module_is_in_a_contract():
    named = _contract_modules()
    missing = [
        _module(p)
        for p in _package_files(PRODUCT)
        if not any(_module(p) == n or _module(p).startswith(n + ".") for n in named)
    ]
    assert missing == [], "name these modules (or a package above them) in a contract of pyproject.toml"


def test_the_simulator_uses_only_the_products_pure_modules():
    # Given the pure modules (the forbidden contract "pure" holds them to no framework and no I/O client), then the
    # simulator imports nothing else of the product.
    pure = next(c for c in CONTRACTS if c["id"] == "pure")["source_modules"]
    impure = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in _package_files(["simulator"])
        for name in _imported(path)
        if name.split(".")[0] in PRODUCT
        and (ROOT / name.replace(".", "/")).with_suffix(".py").exists() | (ROOT / name.replace(".", "/")).is_dir()
        and not any(name == m or name.startswith(m + ".") for m in pure)
    )
    assert impure == []


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _has_reason(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's line, or directly above it (or above the run of imports it belongs to)."""
    if "#" in lines[node.lineno - 1]:
        return True
    index = node.lineno - 2
    while index >= 0 and re.match(r"\s*(from \S+ )?import ", lines[index]):
        index -= 1
    return index >= 0 and lines[index].strip().startswith("#")


def function_level_imports_without_reason(path: Path, *, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)) and not _has_reason(lines, child):
                found.append(f"{path.relative_to(root)}:{child.lineno}: {ast.unparse(child)}")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def test_function_level_imports_say_why():
    # Given every module outside tests and migrations, when its functions import, then each such import carries
    # its reason (a cycle that must stay, a heavy or optional dependency, the app registry not ready yet).
    hidden = [line for path in _source_files() for line in function_level_imports_without_reason(path)]
    assert hidden == [], "move these imports to the module top, or say why they stay:\n" + "\n".join(hidden)


def test_the_checker_sees_a_hidden_import_and_accepts_a_reasoned_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    import json\n\n"
        "def g():\n    # heavy: only for plots\n    import json\n    import csv\n\n"
        "def h():\n    import json  # the caller imports this module\n"
    )
    assert function_level_imports_without_reason(module, root=tmp_path) == ["m.py:2: import json"]


def _cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(m for m in graph.modules if ".migrations" not in m)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in modules:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = edges.get(node, [])
            if position < len(successors):
                work.append((node, position + 1))
                nxt = successors[position]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles_between_modules():
    # Given every import, at the top, inside a function or for type checking only, then no module reaches itself.
    graph = grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=False)
    assert [sorted(cycle) for cycle in _cycles(graph)] == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [frozenset({"a.x", "a.y"})]


def test_tasks_enqueued_by_name_are_registered():
    # Services enqueue with celery.signature("name") so they need not import the task modules that import them;
    # a misspelt name would only show in production, as a message no worker takes.
    names = {
        match for path in _source_files() for match in re.findall(r"signature\(\s*\"([\w.]+)\"", path.read_text())
    }
    assert names >= {"autoscale.horizontal_one", "billing.notifications_deliver", "capacity.benchmark_endpoint"}
    assert names - set(celery_app.tasks) == set()


# A function should read in one pass: 80 lines is about one screen, and what the project's long functions became
# when split into named steps (the longest steps are 60-70 lines of declarative lists: the simulator's metric
# families, the security cases' attempts). The proxy has its own, tighter bound (tests/proxy/test_code_shape.py).
MAX_FUNCTION_LINES = 80
# Functions allowed past the bound, each up to its present length so that it cannot grow, and why.
LONG_FUNCTIONS_ALLOWED = {
    # The two bench entry points that assemble a whole run (workloads, policies, baselines, figures) in one place;
    # each leaves this list when it is split under the bound.
    "benchmarks/capacity/autoscale.py:run": 89,
    "benchmarks/routing/routing_live.py:run_live": 81,
}


def long_functions(path: Path, *, root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"path:function": lines}`` for every function (nested ones too) longer than ``limit`` lines."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found[f"{path.relative_to(root)}:{node.name}"] = lines
    return found


def test_no_function_is_longer_than_a_screen():
    # Given every module outside tests and migrations, then each function fits the bound, or is on the list and
    # no longer than it was when listed.
    found = {name: lines for path in _source_files() for name, lines in long_functions(path).items()}
    too_long = {name: lines for name, lines in found.items() if lines > LONG_FUNCTIONS_ALLOWED.get(name, 0)}
    assert too_long == {}, "split these into named steps (see docs/architecture.md#code-shape)"


def test_the_length_check_counts_from_def_to_last_line(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def fits():\n"
        + "    x = 1\n" * 79
        + "\n\nasync def too_long():\n    def inner():\n        pass\n"
        + "    y = 2\n" * 78
    )
    assert long_functions(module, root=tmp_path) == {"m.py:too_long": 81}

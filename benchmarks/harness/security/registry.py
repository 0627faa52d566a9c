"""The security bench's case registry: each attack case is a small function registered by name.

    @security_case("webhooks.literal_internal_ips", "a tenant admin registers hooks at internal IP literals")
    def literal_internal_ips(world: SecurityWorld) -> str:
        response = world.api(world.a.admin).post(...)
        expect(response.status_code == 400, f"accepted: {response.status_code}")
        return "refused with 400"                      # the one-line detail of a pass

A case passes when it returns (its detail) and fails when it raises: ``CaseFailed`` (from ``expect``) or an
assertion with the reason, any other exception as an error. Cases live in the modules of
``benchmarks.harness.security.cases``; every module there is imported, so adding a case is adding a function (or a module).
Cases that do not need the proxy run inside a transaction that is rolled back, so they cannot disturb each other;
cases with ``needs_proxy`` share the committed world the proxy reads and must leave it as they found it.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import transaction

if TYPE_CHECKING:
    from benchmarks.harness.security.world import SecurityWorld

CASES_PACKAGE = "benchmarks.harness.security.cases"


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    func: Callable[[SecurityWorld], str]
    needs_proxy: bool = False
    quick: bool = True  # also run by --quick


@dataclass(frozen=True)
class CaseResult:
    name: str
    passed: bool
    detail: str
    seconds: float

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "seconds": round(self.seconds, 2)}


class CaseFailed(AssertionError):
    """The attack was not refused; the message says what happened instead."""


CASES: dict[str, Case] = {}


def security_case(name: str, description: str, *, needs_proxy: bool = False, quick: bool = True):
    """Register the decorated function as the attack case ``name`` (dotted: ``area.what``)."""

    def register(func: Callable[[SecurityWorld], str]) -> Callable[[SecurityWorld], str]:
        if name in CASES and CASES[name].func is not func:
            raise ValueError(f"security case {name!r} is registered twice")
        CASES[name] = Case(name=name, description=description, func=func, needs_proxy=needs_proxy, quick=quick)
        return func

    return register


def expect(condition: object, detail: str) -> None:
    if not condition:
        raise CaseFailed(detail)


def cases_load() -> dict[str, Case]:
    """Import every module of the cases package (each registers its cases) and return the registry."""
    package = importlib.import_module(CASES_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{CASES_PACKAGE}.{module.name}")
    return CASES


def cases_select(*, quick: bool, names: list[str] | None = None) -> list[Case]:
    """The cases to run, in name order: ``names`` (exact names or ``area.`` prefixes) or all, quick ones in quick."""
    cases = sorted(cases_load().values(), key=lambda c: c.name)
    if names:
        unknown = [n for n in names if not any(c.name == n or c.name.startswith(n) for c in cases)]
        if unknown:
            raise ValueError(f"no security case matches: {', '.join(unknown)}")
        cases = [c for c in cases if any(c.name == n or c.name.startswith(n) for n in names)]
    return [c for c in cases if c.quick or not quick]


def case_run(case: Case, world: SecurityWorld) -> CaseResult:
    started = time.perf_counter()
    try:
        if case.needs_proxy:
            detail = case.func(world)
        else:
            with transaction.atomic():
                detail = case.func(world)
                transaction.set_rollback(True)
        passed = True
    except AssertionError as exc:  # CaseFailed and plain asserts: the attack was not refused
        passed, detail = False, str(exc) or "assertion failed"
    except Exception as exc:  # noqa: BLE001 - a crashing case is a failed case, the bench goes on
        passed, detail = False, f"error: {type(exc).__name__}: {exc}"
    detail = " ".join(str(detail or "").split())[:300]
    return CaseResult(name=case.name, passed=passed, detail=detail, seconds=time.perf_counter() - started)


def cases_run(cases: list[Case], world: SecurityWorld, *, progress=print) -> list[CaseResult]:
    results = []
    for case in cases:
        result = case_run(case, world)
        progress(f"{'PASS' if result.passed else 'FAIL'} {case.name}: {result.detail}")
        results.append(result)
    return results

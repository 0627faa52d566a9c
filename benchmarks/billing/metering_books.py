"""The arithmetic of ``bench metering`` (pure): what the replicas computed in one phase (one tenant, one client
kind) against what the proxy charged for it, in token work priced at the endpoint's own MU coefficients.

Work is ``alpha·uncached prompt + alpha_cached·cached prompt`` (prefill) and ``beta·output`` (decode): MU without
the per-request ``gamma``, which the engine's counters cannot see (it counts a prompt array or ``n`` choices as
several requests, the proxy as one). A record charges its tokens in proportion to its MU over their list price
(``usage_mu`` times the adapter's factor), so a record of 390 output tokens at 0 MU charges none of them; the part
of a record's MU that paid for loading its LoRA adapter (``adapter_load_mu``: replica time no token counter shows)
is set apart and totalled on its own, with the number of records that caused a load. Prefill
and decode are reconciled apart, phase by phase, so a phase billed too much prefill cannot hide one billed too
little decode, nor one phase another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from capacity.units import MUCoefficients, usage_mu


@dataclass(frozen=True)
class Tokens:
    prompt: float = 0.0  # every prompt token, cached ones included (vllm:prompt_tokens_total)
    cached: float = 0.0  # of which served from the prefix cache
    output: float = 0.0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.prompt + other.prompt, self.cached + other.cached, self.output + other.output)

    def scaled(self, factor: float) -> Tokens:
        return Tokens(self.prompt * factor, self.cached * factor, self.output * factor)

    @property
    def total(self) -> float:
        return self.prompt + self.output

    def work(self, coeffs: MUCoefficients) -> tuple[float, float]:
        """(prefill, decode) work in MU, without the per-request gamma."""
        cached = min(max(self.cached, 0.0), max(self.prompt, 0.0))
        prefill = coeffs.alpha * (self.prompt - cached) + coeffs.alpha_cached * cached
        return prefill, coeffs.beta * self.output

    def as_dict(self) -> dict:
        return {"prompt": round(self.prompt, 1), "cached": round(self.cached, 1), "output": round(self.output, 1)}


@dataclass(frozen=True)
class Charge:
    """One usage record as the books read it."""

    request_id: str
    tenant_id: int
    tokens: Tokens
    mu: float
    adapter_factor: float = 1.0  # the LoRA adapter's MU factor (1 for the base model)
    status: str = "ok"
    load_mu: float = 0.0  # the part of ``mu`` that paid for an adapter load this request caused
    platform_prompt: int = 0  # prompt tokens prefilled again for the platform's failure: charged to the operators

    def charged_share(self, coeffs: MUCoefficients) -> float:
        """The share of its tokens the record charges: its MU over their list price (1 for a record of no tokens)."""
        if self.tokens.prompt <= 0 and self.tokens.output <= 0:
            return 1.0
        list_mu = self.adapter_factor * usage_mu(
            coeffs,
            prompt_tokens=int(self.tokens.prompt),
            cached_tokens=int(self.tokens.cached),
            completion_tokens=int(self.tokens.output),
        )
        return (self.mu - self.load_mu) / list_mu if list_mu > 0 else 1.0

    def charged(self, coeffs: MUCoefficients) -> Tokens:
        return self.tokens.scaled(self.charged_share(coeffs))

    def platform(self) -> Tokens:
        """What the record charges the operators (a resumed stream's prefill again), at the uncached rate."""
        return Tokens(self.platform_prompt, 0, 0)


@dataclass
class Phase:
    """One tenant's traffic of one kind, alone on the fleet: the engines' counter deltas are all its own."""

    kind: str
    tenant_id: int
    sent: int  # requests the clients sent
    response_ids: list[str]  # x-request-id of each response that came back (a client that left early has none)
    computed: Tokens  # replicas' counter deltas over the phase
    charges: list[Charge]  # records of the phase's own key
    strays: list[Charge] = field(default_factory=list)  # other keys' records finished inside the phase's window
    coeffs: MUCoefficients | None = None


@dataclass(frozen=True)
class PhaseBooks:
    kind: str
    tenant_id: int
    requests: int
    records: int
    lost: int
    duplicates: int
    computed: Tokens
    billed: Tokens
    computed_work: float
    billed_work: float
    unbilled_work: float
    overbilled_work: float
    misattributed_work: float
    statuses: dict[str, int]
    adapter_load_mu: float = 0.0
    adapter_loads: int = 0
    platform_prompt: int = 0


def phase_books(phase: Phase) -> PhaseBooks:
    coeffs = phase.coeffs
    own = [c for c in phase.charges if c.tenant_id == phase.tenant_id]
    # Charged to someone: the tenant for its answer, the operators for the prefill their failure made the engine
    # do again (a resumed stream).
    billed = sum((c.charged(coeffs) for c in own), Tokens()) + sum((c.platform() for c in own), Tokens())
    computed_prefill, computed_decode = phase.computed.work(coeffs)
    billed_prefill, billed_decode = billed.work(coeffs)
    unbilled = max(0.0, computed_prefill - billed_prefill) + max(0.0, computed_decode - billed_decode)
    overbilled = max(0.0, billed_prefill - computed_prefill) + max(0.0, billed_decode - computed_decode)
    # Charged to a tenant other than the one that sent it: the phase's own records under another tenant, and any
    # other tenant's record that finished while only this tenant was sending.
    wrong = [c for c in phase.charges if c.tenant_id != phase.tenant_id]
    wrong += [c for c in phase.strays if c.tenant_id != phase.tenant_id]
    misattributed = sum(sum(c.charged(coeffs).work(coeffs)) for c in wrong)
    recorded_ids = {c.request_id for c in phase.charges}
    missing_ids = sum(1 for rid in set(phase.response_ids) if rid not in recorded_ids)
    statuses: dict[str, int] = {}
    for c in phase.charges:
        statuses[c.status] = statuses.get(c.status, 0) + 1
    return PhaseBooks(
        kind=phase.kind,
        tenant_id=phase.tenant_id,
        requests=phase.sent,
        records=len(phase.charges),
        lost=max(phase.sent - len(phase.charges), missing_ids, 0),
        duplicates=max(len(phase.charges) - phase.sent, 0),
        computed=phase.computed,
        billed=billed,
        computed_work=computed_prefill + computed_decode,
        billed_work=billed_prefill + billed_decode + misattributed,
        unbilled_work=unbilled,
        overbilled_work=overbilled,
        misattributed_work=misattributed,
        statuses=statuses,
        adapter_load_mu=sum(c.load_mu for c in own),
        platform_prompt=sum(c.platform_prompt for c in own),
        adapter_loads=sum(1 for c in own if c.load_mu > 0),
    )


def _fraction(part: float, whole: float) -> float:
    return round(part / whole, 6) if whole > 0 else 0.0


def summarize(books: Iterable[PhaseBooks]) -> dict:
    """Totals over phases: fractions of the computed work (misattributed: of the billed work)."""
    books = list(books)
    computed = sum(b.computed_work for b in books)
    billed = sum(b.billed_work for b in books)
    return {
        "requests": sum(b.requests for b in books),
        "records": sum(b.records for b in books),
        "lost": sum(b.lost for b in books),
        "duplicates": sum(b.duplicates for b in books),
        "computed_mu": round(computed, 4),
        "billed_mu": round(billed, 4),
        "unbilled_mu": round(sum(b.unbilled_work for b in books), 4),
        "overbilled_mu": round(sum(b.overbilled_work for b in books), 4),
        "unbilled_fraction": _fraction(sum(b.unbilled_work for b in books), computed),
        "overbilled_fraction": _fraction(sum(b.overbilled_work for b in books), computed),
        "misattributed_fraction": _fraction(sum(b.misattributed_work for b in books), billed),
        "computed_tokens": sum((b.computed for b in books), Tokens()).as_dict(),
        "billed_tokens": sum((b.billed for b in books), Tokens()).as_dict(),
        "adapter_load_mu": round(sum(b.adapter_load_mu for b in books), 4),
        "adapter_loads": sum(b.adapter_loads for b in books),
        "platform_prompt_tokens": sum(b.platform_prompt for b in books),
    }


def by_kind(books: Iterable[PhaseBooks]) -> dict[str, dict]:
    groups: dict[str, list[PhaseBooks]] = {}
    for b in books:
        groups.setdefault(b.kind, []).append(b)
    out = {}
    for kind, group in groups.items():
        statuses: dict[str, int] = {}
        for b in group:
            for status, count in b.statuses.items():
                statuses[status] = statuses.get(status, 0) + count
        out[kind] = {**summarize(group), "statuses": statuses}
    return out


GOALS = {
    "unbilled_fraction_max": 0.005,
    "overbilled_fraction_max": 0.005,
    "misattributed_fraction_max": 0.0,
    "kinds_min": 12,
    "lost_max": 0,
    "duplicates_max": 0,
}


def goals(total: dict, kinds: int) -> dict[str, dict]:
    checks = {
        "unbilled_fraction": (total["unbilled_fraction"], GOALS["unbilled_fraction_max"], "<="),
        "overbilled_fraction": (total["overbilled_fraction"], GOALS["overbilled_fraction_max"], "<="),
        "misattributed_fraction": (total["misattributed_fraction"], GOALS["misattributed_fraction_max"], "<="),
        "kinds": (kinds, GOALS["kinds_min"], ">="),
        "lost_records": (total["lost"], GOALS["lost_max"], "<="),
        "duplicate_records": (total["duplicates"], GOALS["duplicates_max"], "<="),
    }
    return {
        name: {"value": value, "goal": f"{op} {goal}", "passed": value <= goal if op == "<=" else value >= goal}
        for name, (value, goal, op) in checks.items()
    }

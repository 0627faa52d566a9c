"""What one repeat of ``bench fidelity`` measured on the engine, kept whole: the calibration sweep's runs, the
prefill probes and every held-out point's requests (measured, and measured again). ``--opt save=FILE`` writes the
repeats as JSON; ``--opt replay=FILE`` calibrates and predicts from them again without an engine, so a change to
the simulator or the fit is judged on the very measurements an earlier run took (docs/algorithms.md, "Calibration
against real vLLM"). Plain JSON, read with field checks: a capture is data, never code."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from benchmarks.serving.fidelity.load import LoadPoint
from capacity.replica_benchmark.sweep import Sample, Shape

FORMAT = "infercap-fidelity-capture/1"
_SAMPLE_FIELDS = tuple(f.name for f in fields(Sample))


class CaptureError(ValueError):
    """A file that is not a capture this version reads."""


@dataclass
class PointCapture:
    point: LoadPoint
    run_id: str
    samples: list[Sample]
    again: list[Sample] | None = None  # the same load measured again at once (``again=0``: not measured)
    cpu: dict | None = None  # ``load.CpuMeter``'s figures while it was measured


@dataclass
class RepeatCapture:
    runs: list[tuple[LoadPoint, str, list[Sample]]]  # the sweep's runs (``load.Recorder.runs``)
    probes: list[tuple[int, int, float]] | None  # ``probe_prefill``'s (uncached, cached, seconds); None: not probed
    points: list[PointCapture] = field(default_factory=list)
    sweep_fit: dict = field(default_factory=dict)  # the MU fit's α, α_c, β, γ and held-out error
    cpu: dict | None = None  # who used the CPUs during the sweep


def dump(repeats: list[RepeatCapture], *, meta: dict) -> str:
    def point(p: LoadPoint) -> dict:
        return {"shape": asdict(p.shape), "concurrency": p.concurrency, "requests": p.requests,
                "prefix_groups": p.prefix_groups}  # fmt: skip

    def samples(rows: list[Sample] | None) -> list[list] | None:
        return None if rows is None else [[getattr(s, f) for f in _SAMPLE_FIELDS] for s in rows]

    return json.dumps(
        {
            "format": FORMAT,
            **meta,
            "sample_fields": list(_SAMPLE_FIELDS),
            "repeats": [
                {
                    "runs": [{"point": point(p), "run_id": r, "samples": samples(s)} for p, r, s in rep.runs],
                    "probes": None if rep.probes is None else [list(p) for p in rep.probes],
                    "points": [
                        {
                            "point": point(pc.point),
                            "run_id": pc.run_id,
                            "samples": samples(pc.samples),
                            "again": samples(pc.again),
                            "cpu": pc.cpu,
                        }  # fmt: skip
                        for pc in rep.points
                    ],
                    "sweep_fit": rep.sweep_fit,
                    "cpu": rep.cpu,
                }
                for rep in repeats
            ],
        }
    )


def load(text: str) -> tuple[dict, list[RepeatCapture]]:
    """(the run's metadata, its repeats) from ``dump``'s JSON; ``CaptureError`` says what is wrong with it."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CaptureError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CaptureError(f"not a bench fidelity capture (its format is not {FORMAT!r})")
    if doc.get("sample_fields") != list(_SAMPLE_FIELDS):
        raise CaptureError(f"its samples have fields {doc.get('sample_fields')}, this version reads {_SAMPLE_FIELDS}")
    try:
        repeats = [_repeat(rep) for rep in doc["repeats"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CaptureError(f"a malformed repeat: {type(exc).__name__}: {exc}") from None
    if not repeats:
        raise CaptureError("it holds no repeat")
    meta = {k: v for k, v in doc.items() if k not in ("format", "sample_fields", "repeats")}
    return meta, repeats


def _point(d: dict) -> LoadPoint:
    shape = Shape(**{k: int(v) for k, v in d["shape"].items()})
    p = LoadPoint(shape, int(d["concurrency"]), int(d["requests"]), int(d.get("prefix_groups", 1)))
    if min(shape.input_tokens, shape.output_tokens, p.concurrency, p.requests, p.prefix_groups) < 1:
        raise ValueError(f"a load point needs positive sizes: {d}")
    if not 0 <= shape.shared_prefix_tokens <= shape.input_tokens:
        raise ValueError(f"a shared prefix must fit its prompt: {d}")
    return p


def _number(value, *, optional: bool = False) -> bool:
    return (optional and value is None) or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _samples(rows: list[list] | None, requests: int) -> list[Sample] | None:
    """A run's requests: as many as its load point sent (the drivers return one sample per request, failed or
    not), so a replay simulates exactly what was measured."""
    if rows is None:
        return None
    if len(rows) != requests:
        raise ValueError(f"{len(rows)} samples for a load point of {requests} requests")
    out = [Sample(**dict(zip(_SAMPLE_FIELDS, row, strict=True))) for row in rows]
    for s in out:
        numbers = all(_number(v) for v in (s.start_s, s.end_s, s.prompt_tokens, s.cached_tokens, s.output_tokens))
        optional = _number(s.first_token_s, optional=True) and _number(s.accepted_s, optional=True)
        if not (numbers and optional and isinstance(s.ok, bool) and isinstance(s.error, str)):
            raise ValueError(f"a sample's times and token counts must be numbers: {s}")
    return out


def _repeat(rep: dict) -> RepeatCapture:
    runs = []
    for r in rep["runs"]:
        point = _point(r["point"])
        runs.append((point, str(r["run_id"]), _samples(r["samples"], point.requests)))
    probes = rep.get("probes")
    if probes is not None:
        probes = [(int(u), int(c), float(s)) for u, c, s in probes]
    points = []
    for p in rep["points"]:
        point = _point(p["point"])
        samples, again = _samples(p["samples"], point.requests), _samples(p.get("again"), point.requests)
        points.append(PointCapture(point, str(p["run_id"]), samples, again, p.get("cpu")))
    if not runs or not points:
        raise ValueError("a repeat needs the sweep's runs and the held-out points")
    return RepeatCapture(runs, probes, points, dict(rep.get("sweep_fit") or {}), rep.get("cpu"))

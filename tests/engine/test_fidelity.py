"""``bench fidelity`` on the session's real engine, at its smallest size: the calibration sweep, the profile fit,
held-out points measured and predicted, the contract comparison; every figure the bench documents is there and the
errors are finite numbers. (How large they are depends on the machine's neighbours: the bench reports that.)"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.serving import fidelity

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEYS = (
    "real_vllm_version",
    "fidelity.throughput_err",
    "fidelity.ttft_p50_err",
    "fidelity.ttft_p90_err",
    "fidelity.tpot_p50_err",
    "fidelity.prefix_hit_rate_err",
    "fidelity.throughput_err_p90",
    "fidelity.ttft_p50_err_p90",
    "fidelity.ttft_p90_err_p90",
    "fidelity.tpot_p50_err_p90",
    "fidelity.prefix_hit_rate_err_p90",
    "contract_divergences",
    "engine_startup_s",
)


def test_bench_fidelity_calibrates_on_the_engine_and_reports_every_figure(engine, tmp_path):
    messages: list[str] = []
    svg = tmp_path / "fidelity.svg"
    saved = tmp_path / "run.json"
    figures = fidelity.run(
        quick=True, plot=str(svg), progress=messages.append, url=engine.url, size="smoke", save=str(saved)
    )
    json.dumps(figures)  # the command prints it as one line of JSON
    assert list(figures)[-len(KEYS) :] == list(KEYS)  # the documented keys close the line, in their order
    assert figures["real_vllm_version"] == "0.32.0"
    for key in KEYS[1:11]:
        assert math.isfinite(figures[key]) and figures[key] >= 0, (key, figures[key])
    # Counted, and named beside the count (tests/engine/test_contract.py holds the simulator to none).
    assert figures["contract_divergences"] == len(figures["contract_divergence_list"])
    assert figures["engine_startup_s"] is None  # an engine already serving: no start-up measured here
    # Each held-out point was measured on the engine and predicted by the simulator; the shared-prefix one hit the
    # engine's prefix cache as the simulator expected (both count whole 128-token blocks).
    rows = {row["point"]: row for row in figures["points"]}
    assert len(rows) == 2 and all(row["measured"]["throughput_tok_s"] > 0 for row in rows.values())
    mix = next(row for label, row in rows.items() if "p/" in label)
    assert mix["measured"]["prefix_hit_rate"] == pytest.approx(mix["predicted"]["prefix_hit_rate"], rel=0.05)
    # Prefill's rate and attention term were measured by requests sent one at a time, then held while refining.
    assert figures["calibration"]["prefill_probes"] == sum(n for _, n in fidelity.PROBES["smoke"])
    constants = figures["calibration"]["profile"]
    assert constants["decode_t0_ms"] > 0 and constants["prefill_tokens_per_s"] > 0
    assert any(m.startswith("profile fit") for m in messages) and any("vs sim" in m for m in messages)
    assert "<svg" in svg.read_text()
    # Every measurement was kept: fitted and predicted again from the file, without the engine, it gives the same.
    replayed = fidelity.run(quick=True, progress=messages.append, replay=str(saved))
    assert [r["measured"] for r in replayed["points"]] == [r["measured"] for r in figures["points"]]
    assert [r["predicted"] for r in replayed["points"]] == [r["predicted"] for r in figures["points"]]
    assert replayed["real_vllm_version"] == "0.32.0" and replayed["calibration"]["profile"] == constants

"""``bench pd``'s TPOT ceiling: the oracle fleets (every split of the GPUs, clairvoyant pairings) against the aggregated
fleet at the comparison's load, and whether any of them meets both goals at equal GPUs (docs/disaggregation.md,
"The discrete-event model and bench pd"). Pure: it reads the figures ``benchmarks/serving/pd.py`` simulated."""

from __future__ import annotations

ATTAINMENT = 0.9  # the share of requests within both SLOs a fleet must keep (DistServe's goodput)
# The goals (docs/disaggregation.md, "Where the gain comes from"): at equal GPUs, goodput per GPU at least 1.5x the
# aggregated fleet's, with TPOT p90 at most 0.7x the aggregated fleet's at the same load.
GOODPUT_GOAL = 1.5
TPOT_GOAL = 0.7


def tpot_ratios(rows: list[dict], *, aggregated: dict, same_load: dict) -> list[dict]:
    """Each oracle fleet's goodput per GPU and TPOT p90 as ratios to the aggregated fleet's (``aggregated``: its
    highest rate; ``same_load``: its latencies at the comparison's load). The TPOT ratio is None where either fleet
    misses the SLO attainment at that load: the comparison is at the same SLO."""
    goodput, agg_tpot = aggregated["goodput_per_gpu"], same_load["tpot_p90_s"]
    out = []
    for row in rows:
        at = row["same_load"]
        meets = at["attainment"] >= ATTAINMENT and same_load["attainment"] >= ATTAINMENT
        tpot = round(at["tpot_p90_s"] / agg_tpot, 4) if meets and agg_tpot and at["tpot_p90_s"] is not None else None
        row = row | {"goodput_ratio": round(row["goodput_per_gpu"] / goodput, 4) if goodput else None}
        out.append(row | {"tpot_p90_ratio": tpot})
    return out


def tpot_ceiling(rows: list[dict]) -> dict:
    """One seed's TPOT ceiling: the lowest TPOT p90 ratio any oracle fleet that meets the SLO attainment at the
    comparison's load reaches, and the fleets meeting both goals (``GOODPUT_GOAL``, ``TPOT_GOAL``)."""
    eligible = [r for r in rows if r["tpot_p90_ratio"] is not None]
    if not eligible:
        return {"tpot_p90_ratio": None, "split": None, "router": None, "meeting_both": []}
    low = min(eligible, key=lambda r: (r["tpot_p90_ratio"], r["prefill_replicas"]))
    both = [_split_name(r) for r in eligible if _meets_both(r["goodput_ratio"], r["tpot_p90_ratio"])]
    return {"tpot_p90_ratio": low["tpot_p90_ratio"], "split": _split_name(low), "router": low["router"],
            "meeting_both": both}  # fmt: skip


def _split_name(row: dict) -> str:
    return f"{row['prefill_replicas']} + {row['decode_replicas']}"


def _meets_both(goodput_ratio, tpot_ratio) -> bool:
    if goodput_ratio is None or tpot_ratio is None:
        return False
    return goodput_ratio >= GOODPUT_GOAL and tpot_ratio <= TPOT_GOAL


def tpot_ceiling_summary(name: str, per_seed: list[dict]) -> dict:
    """The TPOT ceiling over the seeds: the mean of each seed's ceiling (its lowest ratio, whichever split reached it:
    the optimistic reading) and those splits; each oracle fleet (split and pairing) by its mean goodput ratio and its
    mean TPOT p90 ratio (kept only if it met the SLO attainment at the comparison's load on every seed); and the split
    meeting both goals on those means (the lowest TPOT ratio of them), or None."""
    ceilings = [block["tpot_ceiling"] for block in per_seed]
    fleets: dict = {}
    for block in per_seed:
        for row in block["splits"]:
            fleets.setdefault((row["prefill_replicas"], row["router"]), []).append(row)
    table = []
    for (_, router), rows in sorted(fleets.items()):
        tpot = [r["tpot_p90_ratio"] for r in rows]
        table.append(
            {
                "split": _split_name(rows[0]),
                "router": router,
                "goodput_ratio": _mean([r["goodput_ratio"] for r in rows]),
                "tpot_p90_ratio": _mean(tpot) if len(rows) == len(per_seed) else None,
                "seeds_meeting_slo": sum(ratio is not None for ratio in tpot),
            }
        )
    both = sorted(
        (row for row in table if _meets_both(row["goodput_ratio"], row["tpot_p90_ratio"])),
        key=lambda row: row["tpot_p90_ratio"],
    )
    return {
        f"pd.{name}.tpot_p90_ratio_ceiling": _mean([c["tpot_p90_ratio"] for c in ceilings]),
        f"pd.{name}.tpot_p90_ceiling_split": [c["split"] for c in ceilings],
        f"pd.{name}.split_meeting_both": both[0]["split"] if both else None,
        f"pd.{name}.oracle_splits": table,
    }


def _mean(values: list) -> float | None:
    """The mean, or None if any value is None (a fleet that missed on one seed is not counted on the others)."""
    return None if not values or None in values else round(sum(values) / len(values), 4)

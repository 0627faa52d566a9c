"""``bench placement`` reports the repack ceiling beside the policies (benchmarks/placement.py)."""

from benchmarks.capacity import placement


def test_the_bench_reports_repack_and_its_ratios():
    figures = placement.run(quick=True, hours=2, seeds="1", progress=lambda _: None)
    p99 = {p: figures[f"placement.{p}.pending_p99_s"] for p in ("infercap", "repack", "bound")}
    assert figures["placement.repack.groups_across_domains"] == 0 and figures["placement.repack.deadlocks"] == 0
    assert figures["placement.repack.gpu_allocation"] <= figures["placement.setup"]["runs"][0]["fluid_gpu_allocation"]
    assert figures["placement.infercap.pending_p99_vs_repack"] == round(p99["infercap"] / p99["repack"], 3)
    assert figures["placement.repack.pending_p99_vs_bound"] == round(p99["repack"] / p99["bound"], 3)
    detail = figures["placement.repack.detail"][0]
    assert detail["repacks"] > 0 and detail["moved"] >= detail["repacks"]

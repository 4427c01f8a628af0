"""The words of ``pipebench reproduce schedules``: its markdown page, generated from the
rows ``schedule_table`` simulates. Each row gets one sentence (who wins, by how much, at
what memory, who is slowest); a GPT row also says why it ranks as it does, from its own
numbers (the straight split's slowest stage against the model's largest layer, data
parallelism's all-reduce, the winner's memory and staleness, the tied embedding and head
that the simulator leaves out), and a "deeper" line compares its best straight pipeline
on each cluster. The closing explanation is prose, kept true to the rows by hand.
"""

from __future__ import annotations

from core.markdown import markdown_table
from harness import systems
from harness.reporting.units import fmt_bytes
from harness.sim import schedule_table
from harness.sim.schedule_table import LM_WORKLOADS, straight_cells

__all__ = ["COLUMNS", "EXPLANATION", "markdown", "summary"]

COLUMNS = ("workload", "cluster", "system", "layout", "samples/s", "of best", "bubble",
           "peak memory per worker", "staleness")


def summary(row: dict) -> str:
    """One row in a sentence: who wins, by how much, at what memory (GPT rows: and why)."""
    ok = sorted((c for c in row["cells"] if "error" not in c),
                key=lambda c: -c["throughput_samples_s"])
    if len(ok) < 2:
        return f"{row['workload']} on {row['cluster']}: fewer than two schedules ran"
    a, b = ok[0], ok[1]
    dp = next((c for c in ok if systems.get(c["system"]).kind == "data-parallel"), None)
    light = min(ok, key=lambda c: c["peak_memory_bytes"])
    where = f"; {row['profile']}" if row["workload"] in LM_WORKLOADS else ""
    lead = a["throughput_samples_s"] / b["throughput_samples_s"] - 1
    won = (f"{a['system']} and {b['system']} tie" + (f", both {a['layout']}" if
                                                       a["layout"] == b["layout"] else "")
           if lead < 0.005 else f"{a['system']} wins, {lead:+.0%} over {b['system']}")
    text = (f"**{row['workload']} on {row['cluster']}** ({row['allreduce']} all-reduce"
            f"{where}): {won} (bubble {a['bubble']:.0%} vs {b['bubble']:.0%}")
    if dp is not None and dp is not a:
        text += f"; {a['throughput_samples_s'] / dp['throughput_samples_s']:.2f}x data " \
                "parallelism"
    text += f"); least memory: {light['system']} ({fmt_bytes(light['peak_memory_bytes'])})"
    slow = ok[-1]
    text += (f"; slowest: {slow['system']} "
             f"({slow['throughput_samples_s'] / a['throughput_samples_s']:.2f} of the best).")
    return text + (" " + _why(row, ok) if row["workload"] in LM_WORKLOADS else "")


def _why(row: dict, ok: list[dict]) -> str:
    """Why a GPT row ranks as it does, from its numbers: the straight split's slowest
    stage against the largest layer, data parallelism's all-reduce, memory and staleness,
    and the tied weight that the simulator leaves out."""
    out = []
    straight = straight_cells(ok)
    if straight:
        c = straight[0]
        shares, big = c["stage_shares"], row["largest_layer"]
        p, top = len(shares), max(shares)
        bubbles = sorted(straight, key=lambda c: c["bubble"])
        cause = (f"its {big['position']} layer alone, {big['share']:.0%} of the compute"
                 if top - big["share"] < 1e-9 else f"{top:.0%} of the compute")
        same = row.get("repeated_layers")
        noise = (f"; its {same['count']} identical blocks measured {same['min_share']:.1%} "
                 f"to {same['max_share']:.1%} each: the same work, so that spread is the "
                 "profile's measurement noise" if same else "")
        out.append(f"Why: the slowest stage of the straight {p}-stage split holds {cause} "
                   f"(1/{p} = {1 / p:.0%}{noise}), so a straight pipeline idles at least "
                   f"{1 - 1 / (p * top):.0%} of each period; their bubbles run from "
                   f"{bubbles[0]['bubble']:.0%} ({bubbles[0]['system']}) to "
                   f"{bubbles[-1]['bubble']:.0%} ({bubbles[-1]['system']}).")
    dp = next((c for c in ok if systems.get(c["system"]).kind == "data-parallel"), None)
    if dp is not None:
        same = [c["system"] for c in ok if c is not dp and c["layout"] == dp["layout"]]
        out.append(f"Data parallelism all-reduces {fmt_bytes(row['parameter_bytes'])} of "
                   f"weights per minibatch ({row['allreduce']} all-reduce, bubble "
                   f"{dp['bubble']:.0%})"
                   + (f"; {', '.join(same)}, planning on the links' nominal bandwidth, chose "
                      f"the same layout ({dp['layout']})" if same else "") + ".")
    a = ok[0]
    out.append(f"{a['system']} holds {fmt_bytes(a['peak_memory_bytes'])} per worker at "
               f"staleness {a['staleness']}.")
    for tie in row["ties"][:1]:
        tied = fmt_bytes(tie["bytes"])
        synced = [c for c in ok if c.get("tie") == "synced"]
        refused = [f"{c['system']} ({c['tie'].split(': ')[1]})" for c in ok
                   if c.get("tie", "").startswith("refused")]
        text = (f"The head's matrix is the embedding's ({tied}, {' and '.join(tie['layers'])}"
                "), counted in both layers' parameters: data parallelism's all-reduce above "
                f"counts it twice ({fmt_bytes(row['parameter_bytes'] - tie['bytes'])} "
                "unique)")
        if synced:
            per_mb = synced[0]["bytes_per_sample"] * row["batch"]
            text += (f"; on two stages our runtime exchanges its gradient, {tied} each way "
                     f"per minibatch, which the simulator leaves out (the straight cuts move "
                     f"{fmt_bytes(per_mb)} per minibatch)")
        if refused:
            text += f"; a run would be refused for {', '.join(refused)}"
        out.append(text + ".")
    return " ".join(out)


def _depth(table: list[dict]) -> list[str]:
    """Per GPT workload on several clusters: the best straight pipeline's throughput on
    each (a stage holding one indivisible layer caps it whatever the depth)."""
    out = []
    for label in LM_WORKLOADS:
        best = []
        for r in (r for r in table if r["workload"] == label):
            ok = straight_cells(r["cells"])
            if ok:
                c = max(ok, key=lambda c: c["throughput_samples_s"])
                best.append(f"{c['throughput_samples_s']:.1f} samples/s on {r['cluster']} "
                            f"({c['system']}, {len(c['stage_shares'])} stages, slowest stage "
                            f"{max(c['stage_shares']):.0%} of the compute)")
        if len(best) > 1:
            out.append(f"- **{label}, deeper**: the best straight pipeline makes "
                       + " and ".join(best) + ".")
    return out


def _rate(samples_s: float) -> str:
    """Three significant digits below 100 samples/s (a 0.95B model's 0.3), whole above."""
    return f"{samples_s:.3g}" if samples_s < 100 else f"{samples_s:.0f}"


def markdown(table: list[dict], command: str, png: str | None = None) -> str:
    lines = ["# Which schedule wins where", "", f"Generated by `{command}`.", "",
             schedule_table.__doc__.split("\n\n", 1)[1].strip(), "", "## Row by row", ""]
    lines += [f"- {summary(r)}" for r in table]
    lines += _depth(table)
    if png:
        lines += ["", f"![throughput and memory per schedule]({png})"]
    lines += ["", "## Every schedule", ""]
    cells = []
    for r in table:
        for c in r["cells"]:
            head = [r["workload"], r["cluster"], c["system"]]
            if "error" in c:
                cells.append([*head, "n/a: " + c["error"][:70], "", "", "", "", ""])
                continue
            cells.append([*head, c["layout"], _rate(c["throughput_samples_s"]),
                          f"{c['of_best']:.2f}", f"{c['bubble']:.0%}",
                          fmt_bytes(c["peak_memory_bytes"]), str(c["staleness"])])
    return "\n".join(lines + markdown_table(COLUMNS, cells)) + "\n" + EXPLANATION


EXPLANATION = """
## Why the ranking comes out as it does

- **PipeDream runs what our planner chooses for the all-reduce each row simulates**, each
  replicated stage's all-reduce hidden behind its backward as far as the backward lasts
  (`pipedream_impl/planner/sync_cost.py`): on preset H the ideal ring, on the paper's
  clusters the calibrated one (the planner sees each level's all-reduce at the fitted
  rate, `FlatRing.planner_cluster`: exact on one level, the planner's ring per level
  standing in for the fitted flat ring on two). Where synchronising is cheap the plan is
  data parallelism or replicates stages, and PipeDream ties or beats DP; where it is
  slow (the calibrated NVLink of B, a fitted 0.2 GB/s effective, `reproduce table1`) the
  plan replicates only small weights or none, and PipeDream competes with the straight
  pipelines, where its weight stashing lets it run without a flush. PipeDream pays in
  memory (a stashed version per minibatch in flight) and in staleness (in minibatches: a
  replicated input stage applies r at a time, and where neighbouring stages have
  different replica counts 1F1B-RR's per-stage warm-up keeps more minibatches in flight).
  This table simulates 32 minibatches (a whole number of rounds, at least one): for plans
  whose replica counts have a large least common multiple that is one or a few rounds,
  mostly fill and drain, so their PipeDream rows understate its steady state
  (`reproduce today` simulates 256).
- **Among the straight pipelines, 2BW leads** wherever compute dominates (B:1x8, GNMT-16
  on A:4x4), tied with PipeDream where PipeDream's plan is straight too: neither flushes,
  so no (p - 1) / (m + p - 1) bubble per minibatch; its remaining
  bubble is the stages' imbalance (the slowest stage sets the pace). PipeDream-Flush and
  GPipe pay the flush. With equal stages and free links their bubbles are equal (tests);
  here GPipe is ahead in about half the rows, which we attribute to unequal stages and transfers
  (all forwards first lets a fast stage run ahead; 1F1B ties each backward to the next
  forward) without having isolated it; GPipe holds all m microbatches' activations for
  it (its memory column), PipeDream-Flush at most p.
- **ZB-H1 (our runtime's zero-bubble schedule, one stage per worker) is the best flushing
  straight pipeline in most rows**: the same 1F1B order with each backward split into the
  input gradient (sent at once) and the weight gradient (deferred into the drain), so its
  bubble is a third of PipeDream-Flush's with equal F, I, W (tests) at the same activation
  peak; 2BW, which does not flush at all, is still ahead of it in most rows. Here W is
  charged as half of each weighted layer's backward, an assumption, not a measurement.
- **Two stages per worker (torch's interleaved 1F1B, ZB1P, ZB-V, DualPipeV) helps only
  where the model splits evenly into 2p pieces and links are fast**: their bubble is
  smaller in theory ((p - 1)/(vm), zero for ZB-V; see tests) but each extra cut crosses a
  link (bytes per sample up to about 1.7x the straight split's, e.g. GNMT-16 on A:1x4) and
  VGG-16's and ResNet-50's uneven layers give a worse slowest stage at 2p stages. ZB-V and
  DualPipeV keep the V's turn on one worker (one cut fewer on a link than the looped
  placements) and fill the bubble with weight gradients, so they lead this group and beat
  the flush schedules on ResNet-50 (A:1x4, B:1x8). Rows with fewer layers than 2p stages
  (GNMT-16 and ResNet-50 on H:2x8, our 19- and 23-layer profiles; GPT-2's 14 layers on
  B:1x8) cannot run them.
- **Data parallelism (and PipeDream, whose plan there is data parallelism) wins on C:4x1
  and on every current-cluster row**: on C (one GPU per
  server on 10 Gbps) the calibrated network efficiency is 1.0 and DP's ring overlaps with
  the backward, while every pipeline's cut crosses the same slow network; on preset H
  (NVLink 4, 400 Gbps, ideal ring) the all-reduce hides behind the backward entirely.
  Where the calibrated all-reduce is slow (A and B rows) DP's exposed communication is
  its bubble column (up to 94% for GNMT-16, whose LSTM weights are large, among the V100
  rows; the GPT rows below).
- **Deep straight pipelines (16 stages on A:4x4 and H:2x8) all lose**: the profiles'
  layers are too unequal for 16 or 32 balanced stages, and cuts cross the slow
  inter-server link.
- **GPT rows (our CPU profiles scaled to a V100: compare within a row): one layer, or all
  the weights, decide.** GPT-2's head, the 768 x 50,257 projection and the loss over its
  logits, is one layer with several blocks' worth of compute, so no straight split beats
  that layer's stage: every straight schedule idles at least the bound its row prints,
  2BW (which never flushes) and ZB-H1 come closest, and the "deeper" line shows what
  doubling the pipeline buys. The Llama-style model's head (32,000 tokens against 16
  blocks of width 2,048) is about one block's worth, so its stages can be even, and what
  is left of its imbalance is largely the profile's noise (each row gives the spread of
  its identical blocks). Data parallelism all-reduces every weight per minibatch on the
  calibrated links, so it trails every pipeline there; PipeDream's planner, seeing those
  links, plans a straight pipeline, which runs without a flush as 2BW does. GPT-2's head
  is its embedding: the simulator models no tie (its rows say what that leaves out and
  which runs would be refused); the Llama-style model has none.
- **Memory**: flush schedules hold one weight version; 2BW two; PipeDream one per
  minibatch in flight on early stages. Activations in flight: GPipe keeps all m
  microbatches, 1F1B-style schedules at most the pipeline's depth, interleaving about one
  more round, ZB-V as 1F1B. PipeDream-Flush or ZB-H1 is the lightest in most rows.
- **Staleness**: 0 for every flushing schedule and data parallelism, 1 for 2BW, more for
  PipeDream (counted in minibatches; a replicated stage applies r at a time).
- Microbatch compute scales linearly here; on a real GPU small microbatches run below
  peak, which penalises the microbatched schedules (not modelled). GNMT-16's V100
  profile is of a small batch, hence its low samples/s, and the GPT profiles are of 8
  windows of 1,024 tokens (GPT-2) and one of 2,048 (Llama-style): compare within a row.
"""

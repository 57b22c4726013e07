"""Merge a partial benchmark run (``run.py --op ...``) into a group's recorded results.

A run limited to some ops writes a group JSON holding only those ops. This replaces the records of
those ops in the recorded ``docs/benchmarks/<group>.json`` (the others stay), marks each merged
record with its run's commit, date and copy bandwidth, notes the merge in ``partial_updates``,
rewrites the group's markdown and copies the merged ops' plots. A peer that the run did not time
at all (not carried that day) keeps its recorded figures, each marked with its own run.

    python -m shared.bench.merge docs/benchmarks/attention.json /tmp/run/benchmarks/attention.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from shared.bench import report


def merge(recorded: dict, partial: dict) -> dict:
    """``recorded`` with the records of ``partial``'s ops replaced by ``partial``'s."""
    ops = sorted({r["op"] for r in partial["records"]})
    run = {k: partial[k] for k in ("commit", "date", "copy_gbps", "static_compile") if k in partial}
    timed = {r["impl"] for r in partial["records"]}
    recorded_run = {k: recorded[k] for k in run if k in recorded}
    # A peer this run did not time (not carried that day) keeps its last figures, with their run.
    kept = [
        {"run": recorded_run, **r}
        for r in recorded["records"]
        if r["op"] in ops and r["impl"] not in timed
    ]
    records = [r for r in recorded["records"] if r["op"] not in ops] + kept
    records += [{**r, "run": run} for r in partial["records"]]
    merged = {**recorded, "records": records}
    peers = {**recorded.get("peers", {}), **partial.get("peers", {})}
    for name, info in partial.get("peers", {}).items():
        if not info.get("ran") and recorded.get("peers", {}).get(name, {}).get("ran"):
            peers[name] = {**recorded["peers"][name], "ran_in": recorded_run.get("commit")}
    if peers:
        merged["peers"] = peers
    merged["partial_updates"] = [
        *(u for u in recorded.get("partial_updates", []) if set(u["ops"]) - set(ops)),
        {"ops": ops, **run},
    ]
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.bench.merge", description=__doc__)
    parser.add_argument("recorded", type=Path, help="docs/benchmarks/<group>.json")
    parser.add_argument("partial", type=Path, help="<group>.json of a run limited with --op")
    args = parser.parse_args(argv)
    group = args.recorded.stem
    recorded = json.loads(args.recorded.read_text())
    partial = json.loads(args.partial.read_text())
    merged = merge(recorded, partial)
    args.recorded.write_text(json.dumps(merged, indent=1) + "\n")
    args.recorded.with_suffix(".md").write_text(report.markdown(group, merged))
    for op in merged["partial_updates"][-1]["ops"]:
        for plot in args.partial.parent.glob(f"{group}-{op}*.png"):
            shutil.copyfile(plot, args.recorded.parent / plot.name)
    print(f"{group}: merged {', '.join(merged['partial_updates'][-1]['ops'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

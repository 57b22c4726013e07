"""Markdown tables, the summary against the targets, and PNG plots of benchmark results.

python -m shared.bench.report [docs/benchmarks]   # the summary of every <group>.json there
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from shared.bench.shapes import BANDWIDTH_SHAPES, DECODE_TOKENS

OURS = ("cuda", "triton", "cpu")


def _key(record: dict) -> tuple:
    """(op, dtype, shape, note): a suite's cases of one op, shape and dtype (a mask density, a
    cache layout, a sampling order) differ by their note, and each keeps its own row."""
    return (record["op"], record["dtype"], tuple(record["shape"]), record.get("note", ""))


def _variants(records: list[dict]) -> set[tuple]:
    """The (op, dtype, shape) keys recorded under more than one note: only there does a table
    row or a plot line name its note."""
    notes: dict[tuple, set[str]] = defaultdict(set)
    for r in records:
        notes[_key(r)[:3]].add(r.get("note", ""))
    return {key for key, seen in notes.items() if len(seen) > 1}


def _mode(record: dict) -> str:
    """How a torch_compile row was compiled ('static' or 'auto'); '' for other rows and for
    results written before the mode was recorded."""
    return record.get("compile", "")


def _compile_legend(result: dict) -> str:
    modes = {_mode(r) for r in result["records"] if r["impl"] == "torch_compile"} - {""}
    if not modes:
        return ""
    setting = result.get("static_compile")
    return (
        " `x torch_compile`: a static graph compiled for that shape (`dynamic=False`)"
        + (f", static at the shapes of `--static-compile {setting}`" if setting else "")
        + "; a ratio marked `(auto)` is against default torch.compile (automatic-dynamic after "
        "the first shape), which is weaker at large shapes."
    )


EAGER_LEGEND = (
    " A ratio marked `(eager)` is against a peer that syncs with the host (a reference that"
    " validates its inputs there), so it could not be captured in a graph: it was timed by"
    " eager launches, its launch and sync costs included."
)


def _peers_line(result: dict) -> str:
    peers = result.get("peers")
    if not peers:
        return ""
    parts = []
    for name, info in peers.items():
        version = info.get("version") or info.get("build", {}).get("flashinfer_version")
        state = "ran" if info.get("ran") else info.get("status", "?")
        parts.append(f"{name} ({version}, {state})" if version else f"{name} ({state})")
    return "Peers: " + ", ".join(parts) + "."


def markdown(group: str, result: dict) -> str:
    """One row per (op, shape, dtype): our time, % of copy, and the ratio of each peer to ours."""
    rows: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in result["records"]:
        rows[_key(r)][r["impl"]] = r
    peers = sorted({r["impl"] for r in result["records"]} - set(OURS))
    lines = [
        f"# {group} benchmarks",
        "",
        f"{result['gpu']}, {result['date']}, commit {result['commit']}, copy bandwidth "
        f"{result['copy_gbps']:.0f} GB/s (read + write). Times are medians under CUDA graphs with "
        "inputs rotated past the L2; `x peer` is the peer's time divided by ours (> 1: we are "
        "faster)."
        + _compile_legend(result)
        + (EAGER_LEGEND if any("timing" in r for r in result["records"]) else ""),
        "",
        *([_peers_line(result), ""] if result.get("peers") else []),
        *(
            [
                f"Merged later (`python -m shared.bench.merge`): {', '.join(u['ops'])} from "
                f"commit {u.get('commit', '?')}, {u.get('date', '?')}, copy "
                f"{u.get('copy_gbps', 0):.0f} GB/s, static compile {u.get('static_compile', '?')}."
                for u in result.get("partial_updates", [])
            ]
            + ([""] if result.get("partial_updates") else [])
        ),
        "| op | shape | dtype | ours | us | % of copy | torch copy of its bytes (us) | "
        + " | ".join(f"x {p}" for p in peers)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(peers),
    ]
    variants = _variants(result["records"])
    for (op, dtype, shape, note), impls in sorted(rows.items()):
        ours = next((impls[i] for i in OURS if i in impls), None)
        if ours is None:
            continue
        ratios = [
            f"{impls[p]['us'] / ours['us']:.2f}"
            + (" (auto)" if _mode(impls[p]) == "auto" else "")
            + (" (eager)" if impls[p].get("timing", "graph") != "graph" else "")
            if p in impls
            else "-"
            for p in peers
        ]
        torch_copy = f"{ours['copy_us']:.2f}" if "copy_us" in ours else "-"
        shown = f"{list(shape)} {note}" if (op, dtype, shape) in variants else f"{list(shape)}"
        lines.append(
            f"| {op} | {shown} | {dtype} | {ours['impl']} | {ours['us']:.2f} | "
            f"{ours['pct_of_copy']:.1f} | {torch_copy} | " + " | ".join(ratios) + " |"
        )
    return "\n".join(lines) + "\n"


def summary(results: dict[str, dict]) -> str:
    """One row per op of each group: % of copy at the bandwidth-target shapes, the slowest decode
    time (with torch's copy of the same bytes at that shape, where measured), and for each peer the
    shapes where we are at least as fast and the worst ratio."""
    lines = [
        "| op | % of copy at "
        + ", ".join("x".join(map(str, s)) for s in BANDWIDTH_SHAPES)
        + f" | decode max (us, tokens {'/'.join(map(str, DECODE_TOKENS))}; "
        "torch copy of its bytes) | peers: shapes won, worst ratio (peer time / ours) |",
        "|---|---|---|---|",
    ]
    for group, result in results.items():
        rows: dict[str, dict[tuple, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
        for r in result["records"]:
            rows[r["op"]][_key(r)[1:]][r["impl"]] = r
        for op, by_shape in rows.items():
            ours = {
                key: next(impls[i] for i in OURS if i in impls)
                for key, impls in by_shape.items()
                if any(i in impls for i in OURS)
            }
            pct = [
                f"{ours[key]['pct_of_copy']:.0f}"
                for shape in BANDWIDTH_SHAPES
                for key in ours
                if key[1] == shape
            ]
            decode = [r for key, r in ours.items() if key[1][0] in DECODE_TOKENS]
            verdicts = []
            for peer in sorted({i for impls in by_shape.values() for i in impls} - set(OURS)):
                ratios = [
                    (impls[peer]["us"] / ours[key]["us"], key[1])
                    for key, impls in by_shape.items()
                    if peer in impls and key in ours
                ]
                if not ratios:
                    continue
                worst, at = min(ratios)
                won = sum(ratio >= 1 for ratio, _ in ratios)
                where = f"{worst:.2f} at {list(at)}" if worst < 1 else f">= {worst:.2f}x"
                modes = sorted(
                    {_mode(impls[peer]) for impls in by_shape.values() if peer in impls} - {""}
                )
                label = f"{peer} [{'+'.join(modes)}]" if modes else peer
                verdicts.append(f"{label} {won}/{len(ratios)} ({where})")
            slowest = "-"
            if decode:
                worst = max(decode, key=lambda r: r["us"])
                torch_copy = f" ({worst['copy_us']:.2f})" if "copy_us" in worst else ""
                slowest = f"{worst['us']:.2f}{torch_copy}"
            lines.append(
                f"| {group}.{op} | {' / '.join(pct) or '-'} | {slowest} | "
                + "; ".join(verdicts)
                + " |"
            )
    return "\n".join(lines) + "\n"


# An op whose best run of ours moves less than this fraction of the copy bandwidth is latency
# bound (an LP solve, a 64-slot hash chain): its plot shows time, where GB/s would be a flat zero.
LATENCY_BOUND_PCT = 10.0


def _latency_bound(records: list[dict]) -> bool:
    ours = [r["pct_of_copy"] for r in records if r["impl"] in OURS]
    return bool(ours) and max(ours) < LATENCY_BOUND_PCT


def plots(group: str, result: dict, out_dir: Path) -> list[Path]:
    """One PNG per op: GB/s (time, for a latency-bound op) against the leading dimension, one line
    per implementation, a panel per width."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return []
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in result["records"]:
        by_op[r["op"]].append(r)
    variants = _variants(result["records"])

    def variant(r: dict) -> str:  # the note, where it tells this record's line apart
        return r.get("note", "") if _key(r)[:3] in variants else ""

    written = []
    for op, records in sorted(by_op.items()):
        widths = sorted({tuple(r["shape"][1:]) for r in records})
        metric = "us" if _latency_bound(records) else "gbps"
        fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 4), squeeze=False)
        for ax, width in zip(axes[0], widths, strict=True):
            # one line per implementation, torch_compile split by how each shape was compiled
            for impl, mode, note in sorted({(r["impl"], _mode(r), variant(r)) for r in records}):
                points = sorted(
                    (r["shape"][0], r[metric])
                    for r in records
                    if r["impl"] == impl
                    and _mode(r) == mode
                    and variant(r) == note
                    and tuple(r["shape"][1:]) == width
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    label = f"{impl} [{mode}]" if mode else impl
                    label += f" ({note})" if note else ""
                    ax.plot(
                        xs,
                        ys,
                        marker="o" if mode != "auto" else "x",
                        label=label,
                        linewidth=2.5 if impl in OURS else 1.2,
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens")
            if metric == "us":
                ax.set_yscale("log")
                ax.set_ylabel("us (lower is better)")
            else:
                ax.axhline(result["copy_gbps"], color="gray", linestyle="--", label="copy")
                ax.set_ylabel("GB/s")
            ax.set_title(f"{op} {list(width)}")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{group}.{op}\n{result['gpu']}, {result['date']}, {result['commit']}")
        fig.tight_layout()
        path = out_dir / f"{group}-{op}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/benchmarks"])[0])
    results = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    if not results:
        print(f"no <group>.json in {folder}", file=sys.stderr)
        return 2
    print(summary(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

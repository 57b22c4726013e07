"""The benchmark report (markdown table and target summary) on synthetic records: no GPU."""

from __future__ import annotations

import json

from shared.bench import report
from shared.bench.shapes import BANDWIDTH_SHAPES, DECODE_TOKENS, token_grid


def _record(op: str, impl: str, shape: tuple[int, int], us: float, pct: float = 50.0) -> dict:
    return {
        "op": op,
        "impl": impl,
        "shape": list(shape),
        "dtype": "bfloat16",
        "us": us,
        "gbps": 1.0,
        "pct_of_copy": pct,
    }


def _result() -> dict:
    records = []
    for i, shape in enumerate(BANDWIDTH_SHAPES):
        records.append(_record("relu2", "cuda", shape, 10.0, pct=91.0 + i))
        records.append(_record("relu2", "liger", shape, 12.0))
    records.append(_record("relu2", "cuda", (16, 4096), 1.5))
    records.append(_record("relu2", "liger", (16, 4096), 1.2))  # the peer wins here
    records.append(_record("relu2", "cuda", (64, 4096), 1.9) | {"copy_us": 1.25})
    return {
        "gpu": "H200",
        "date": "2026-12-02",
        "commit": "abc",
        "copy_gbps": 4000.0,
        "records": records,
    }


def test_summary_reports_targets_and_worst_peer_ratio():
    lines = report.summary({"activation": _result()}).splitlines()
    row = next(line for line in lines if line.startswith("| activation.relu2 "))
    assert "91 / 92 / 93 / 94" in row
    assert "| 1.90 (1.25) |" in row  # the slowest decode time, and torch's copy there
    assert "liger 4/5 (0.80 at [16, 4096])" in row


def test_markdown_ratio_is_peer_over_ours():
    table = report.markdown("activation", _result())
    assert "| relu2 | [16, 4096] | bfloat16 | cuda | 1.50 | 50.0 | - | 0.80 |" in table
    assert "| relu2 | [64, 4096] | bfloat16 | cuda | 1.90 | 50.0 | 1.25 | - |" in table


def test_cli_prints_summary_of_a_folder(tmp_path, capsys):
    (tmp_path / "activation.json").write_text(json.dumps(_result()))
    assert report.main([str(tmp_path)]) == 0
    assert "activation.relu2" in capsys.readouterr().out
    assert report.main([str(tmp_path / "missing")]) == 2


def test_grid_covers_the_target_shapes():
    grid = set(token_grid(quick=False))
    assert set(BANDWIDTH_SHAPES) <= grid
    assert all((t, 4096) in grid for t in DECODE_TOKENS)
    assert set(token_grid(quick=True)) <= grid

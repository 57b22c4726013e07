"""shared.bench.switches: settings parsed from the command line, every case timed under every
setting with the module's attributes set as asked, and restored afterwards (CPU, stub cases)."""

from __future__ import annotations

import types

import pytest

from shared.bench import switches


def _module() -> types.ModuleType:
    module = types.ModuleType("kernels_stub.ops.op")
    module._RING = 0
    module._PUSH = False
    return module


def _case(op: str, note: str = "") -> types.SimpleNamespace:
    return types.SimpleNamespace(op=op, shape=[4, 8], note=note)


def test_parse_settings():
    settings = switches.parse_settings(
        ["off:_RING=-1", "on:_RING=16,_PUSH=True"], ["_RING=0,16", "_PUSH=False,True"]
    )
    assert settings[:3] == [
        ("default", {}),
        ("off", {"_RING": -1}),
        ("on", {"_RING": 16, "_PUSH": True}),
    ]
    assert [name for name, _ in settings[3:]] == [
        "RING=0 PUSH=False", "RING=0 PUSH=True", "RING=16 PUSH=False", "RING=16 PUSH=True",
    ]  # fmt: skip
    assert settings[-1][1] == {"_RING": 16, "_PUSH": True}


@pytest.mark.parametrize(
    ("settings", "grids", "match"),
    (
        (["off"], [], "name:A=v"),
        (["off:_RING"], [], "NAME=VALUE"),
        (["off:_RING=x y"], [], "not a Python literal"),
        ([], ["_RING"], "NAME=v1,v2"),
        (["default:_RING=1"], [], "must differ"),
    ),
)
def test_parse_settings_errors(settings, grids, match):
    with pytest.raises(SystemExit, match=match):
        switches.parse_settings(settings, grids)


def test_run_sets_and_restores_each_setting():
    module = _module()
    seen: list[tuple] = []

    def time_case(case):
        def once() -> float:
            seen.append((case.op, module._RING, module._PUSH))
            return 10.0 - module._RING / 4 + (5.0 if module._PUSH else 0.0)

        return once

    lines: list[str] = []
    settings = switches.parse_settings(["ring:_RING=16"], ["_PUSH=False,True"])
    results = switches.run(
        module, [_case("op"), _case("op_l2warm", "warm")], settings, 2, time_case, lines.append
    )
    assert (module._RING, module._PUSH) == (0, False)  # restored
    # each round runs every setting once, in order, with the other attributes at their defaults
    assert seen[:4] == [("op", 0, False), ("op", 16, False), ("op", 0, False), ("op", 0, True)]
    assert len(seen) == 2 * 2 * 4
    assert results["op [4, 8]"] == {
        "default": 10.0,
        "ring": 6.0,
        "PUSH=False": 10.0,
        "PUSH=True": 15.0,
    }
    assert lines[0] == "defaults of kernels_stub.ops.op: _PUSH=False, _RING=0"
    assert lines[2] == "| case | shape | default | ring | PUSH=False | PUSH=True |"
    assert lines[4] == "| op | [4, 8] | 10.00 | **6.00** | 10.00 | 15.00 |"
    assert lines[5].startswith("| op_l2warm warm | [4, 8] |")


def test_run_restores_after_a_failure_and_rejects_unknown_attributes():
    module = _module()

    def time_case(case):
        def once() -> float:
            if module._RING == 16:
                raise RuntimeError("kernel failed")
            return 1.0

        return once

    with pytest.raises(RuntimeError):
        switches.run(
            module,
            [_case("op")],
            switches.parse_settings(["on:_RING=16"], []),
            1,
            time_case,
            lambda _: None,
        )
    assert module._RING == 0
    with pytest.raises(SystemExit, match="has no attribute _NOPE"):
        switches.run(
            module, [_case("op")], switches.parse_settings(["x:_NOPE=1"], []), 1, time_case
        )


def test_op_cases_and_cli_errors(monkeypatch):
    cases = [
        types.SimpleNamespace(op="store_cache", impls={"cuda": 1}),
        types.SimpleNamespace(op="store_cache_l2warm", impls={"cuda": 1}),
        types.SimpleNamespace(op="store_cachex", impls={"cuda": 1}),
        types.SimpleNamespace(op="store_cache", impls={"torch": 1}),
    ]
    monkeypatch.setattr(switches.suites, "cases", lambda group, quick, ops: cases)
    assert switches.op_cases("kvcache", "store_cache", False) == cases[:2]
    with pytest.raises(SystemExit):
        switches.main(["--group", "kvcache", "--op", "store_cache"])  # no setting given

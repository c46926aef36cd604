"""bench/decode_residual.py's code path on CPU (--smoke: a tiny launch under the interpreter):
every kernel variant is judged against float64 before it is timed, a wrong one is reported
and not timed, and the JSON and Markdown hold the rows."""

from __future__ import annotations

import json

from bench import decode_residual


def test_smoke_run_checks_times_and_reports(tmp_path):
    assert decode_residual.main(["--smoke", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "decode-residual.json").read_text())
    (row,) = payload["rows"]
    assert payload["smoke"] and row["launch"] == "8x256x128"
    assert row["one"]["reduction"] == "cluster" and row["one"]["split_k"] == 2
    for label, entry in row["variants"].items():
        assert entry["error"] <= 1.0 and len(entry["rounds_us"]) == decode_residual.ROUNDS, label
    assert row["variants"]["stock"]["ratio"] == 1.0
    assert "| 8x256x128 |" in (tmp_path / "decode-residual.md").read_text()


def test_a_wrong_kernel_is_reported_not_timed(tmp_path, monkeypatch):
    real = decode_residual.variants

    def statistic_off_by_one_percent(two, one, interpret):
        fns = real(two, one, interpret)
        good = fns["one launch"]
        fns["one launch"] = lambda x, w, r: (lambda h, ms: (h, ms * 1.01))(*good(x, w, r))
        return fns

    monkeypatch.setattr(decode_residual, "variants", statistic_off_by_one_percent)
    assert decode_residual.main(["--smoke", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "decode-residual.json").read_text())["rows"]
    one = row["variants"]["one launch"]
    assert one["failure"].startswith("wrong against float64: mean(h^2)")
    assert "rounds_us" not in one and "rounds_us" in row["variants"]["two launches"]

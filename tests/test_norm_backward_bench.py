"""bench/norm_backward.py on CPU: both variants judged against float64, and its table writer."""

import importlib.util
import json

import pytest

from bench import norm_backward


def test_smoke_run_checks_both_variants(tmp_path):
    assert norm_backward.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "norm-backward.json").read_text())
    assert [(row["gain"], row["stream"], row["cotangents"]) for row in doc["rows"]] == [
        (True, True, 1), (True, True, 2), (True, True, 3), (False, False, 1)]
    for row in doc["rows"]:
        labels = [e["label"] for e in row["variants"]]
        assert labels == ["kernel", "stock"] + (["kernel, stream added in it"]
                                                if row["stream"] else [])
        for entry in row["variants"]:
            assert entry["correct"] and entry["err_tol"] <= 1.0, entry
    assert (tmp_path / "norm-backward.md").read_text().count("16x256") == 4


def test_table_takes_gpu_runs_only_and_keeps_their_ratios(tmp_path):
    assert norm_backward.main(["--smoke", "--out", str(tmp_path)]) == 0
    smoke = json.loads((tmp_path / "norm-backward.json").read_text())
    try:
        norm_backward.table_source([smoke], "cmd", "abc")
        raise AssertionError("a smoke run must not become a table")
    except ValueError as err:
        assert "GPU run" in str(err)
    gpu = dict(smoke, smoke=False, sms=132)
    source = norm_backward.table_source([gpu], "cmd", "abc")
    path = tmp_path / "table.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("table", path)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    by = {(row["gain"], row["cotangents"], e["label"]): e
          for row in gpu["rows"] for e in row["variants"]}

    def entry(gain: bool, label: str, cotangents: int = 1) -> tuple:
        ratio = round(by[gain, cotangents, label]["vs_stock"], 3)
        return ((16, 256), "bfloat16", gain, label != "kernel", cotangents, ratio,
                by[gain, cotangents, "stock"]["us"] - by[gain, cotangents, label]["us"])

    # The smoke's stream rows: one cotangent both ways; two and three summed in the kernel
    # only (the op never sums them in a pass of its own before it).
    expected = [entry(True, "kernel"), entry(True, norm_backward.KERNEL_ADD),
                entry(True, norm_backward.KERNEL_ADD, 2),
                entry(True, norm_backward.KERNEL_ADD, 3), entry(False, "kernel")]
    assert [e[:6] for e in table.ENTRIES] == [e[:6] for e in expected]
    assert [e[6] for e in table.ENTRIES] == pytest.approx([e[6] for e in expected], abs=0.051)
    assert table.PROVENANCE["sms"] == 132 and table.PROVENANCE["commit"] == "abc"


def test_configs_sweep_checks_every_candidate_and_writes_the_fastest(tmp_path):
    """--configs under the interpreter: every candidate checked against float64 (race-free),
    the selected one first; --write-configs keeps each shape's fastest and its ratio."""
    assert norm_backward.main(["--smoke", "--configs", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "norm-backward-configs.json").read_text())
    (row,) = doc["rows"]
    candidates = [e for e in row["variants"] if "ctas" in e]
    assert len(candidates) >= 4 and candidates[0]["selected"]
    assert all(e["correct"] and e["err_tol"] <= 1.0 for e in candidates), candidates
    gpu = dict(doc, smoke=False)
    path = tmp_path / "configs.py"
    path.write_text(norm_backward.configs_source([gpu], "cmd", "abc"))
    spec = importlib.util.spec_from_file_location("configs", path)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    fastest = min(candidates, key=lambda e: e["us"])
    ((shape, dtype, block_m, steps, ratio, before),) = table.ENTRIES
    assert (list(shape), dtype, block_m, steps) == (row["shape"], "bfloat16",
                                                     fastest["block_m"], fastest["steps"])
    assert ratio == round(fastest["vs_stock"], 3) and table.PROVENANCE["commit"] == "abc"
    assert before == round(candidates[0]["vs_stock"], 3)


def test_training_shapes_reach_every_preset_norm():
    """Every training norm of the presets has a shape in the bench within dispatch's reach
    (same K, M within 2x): Gemma-3-1B's one key head a token (2048x256) is 4x from its
    query heads' rows, so it is measured on its own."""
    from bench.model_suite import SHAPES

    shapes = norm_backward.training_shapes()
    assert (2048, 256) in shapes and (8192, 256) in shapes and (2048, 1152) in shapes
    for preset in SHAPES.values():
        c, rows = preset.cfg, preset.train[0] * preset.train[1]
        norms = [(rows, c.d_model)]
        if c.qk_norm:
            norms += [(rows * c.n_heads, c.head_dim), (rows * c.n_kv_heads, c.head_dim)]
        for m, k in norms:
            assert any(sk == k and max(sm, m) <= 2 * min(sm, m) for sm, sk in shapes), (m, k)

"""bench/gemm_sweep.py on a CPU: the interpreter at tiny shapes, through the JSON and Markdown
it writes, the budget stop, and the table it turns the JSON into."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from bench import gemm_candidates, gemm_sweep, gemm_table_writer
from bench.shapes import parse_mkn
from pallas_kernels import gemm_config, gemm_configs, hardware
from pallas_kernels.gemm_config import (MatmulDimension, TuningConfig, config_fields,
                                        config_from_fields, smem_bytes)


def _run(tmp_path, *extra: str) -> dict:
    assert gemm_sweep.main(["--quick", "--out", str(tmp_path), *extra]) == 0
    return json.loads((tmp_path / gemm_sweep.JSON_NAME).read_text())


def test_quick_sweep_checks_times_and_tabulates(tmp_path):
    doc = _run(tmp_path, "--shapes", "128x64x512,64x64x128")
    rows = {tuple(r["shape"]): r for r in doc["shapes"]}
    assert set(rows) == {(128, 64, 512), (64, 64, 128)}
    for shape, row in rows.items():
        assert row["status"] == "timed", row
        ok = {n: r for n, r in row["results"].items() if r["status"] == "ok"}
        assert row["default"] in ok  # every shape times its default config
        for result in ok.values():  # checked against XLA before it was timed
            assert result["rel_error"] <= gemm_sweep.REL_TOL
            assert result["us"] > 0
            assert result["ratio"] == round(result["us"] / row["cublas_us"], 4)
        assert row["best_us"] == min(r["us"] for r in ok.values())
        assert len(row["cublas_samples_us"]) >= 2  # cuBLAS before and after the configs
    # The screen shape saw the screen configs and the refinements of the best.
    screen = rows[(128, 64, 512)]["results"]
    assert len(screen) > 1 + gemm_sweep.QUICK_PLAN.max_screen
    assert any(n.endswith("_cN") and r["status"] == "ok" for n, r in screen.items())
    # The other shape saw its default and the carried config.
    carried = doc["meta"]["carried_configs"]
    assert len(carried) == 1 and carried[0] in rows[(64, 64, 128)]["results"]
    md = (tmp_path / gemm_sweep.MD_NAME).read_text()
    assert "| 128x64x512 |" in md and "| 64x64x128 |" in md
    assert rows[(128, 64, 512)]["best"] in md


def test_budget_stops_cleanly(tmp_path):
    doc = _run(tmp_path, "--shapes", "128x64x512", "--budget-s", "0")
    (row,) = doc["shapes"]
    assert row["status"] == "untimed" and not row["results"]
    assert "stopped_at_s" in doc["meta"]
    assert "untimed" in (tmp_path / gemm_sweep.MD_NAME).read_text()


def test_candidates_fit_shared_memory_and_round_trip():
    configs = gemm_candidates.screen()
    configs += [c for top in configs for c in gemm_candidates.refinements(top)]
    assert len({gemm_candidates.name(c) for c in configs}) == len(set(configs))
    assert {(c.cta_tile_m, c.cta_tile_n) for c in configs} == {(128, 256), (256, 128),
                                                                 (128, 128)}
    assert {c.cluster_dimension for c in configs} == {None, MatmulDimension.M, MatmulDimension.N}
    assert {c.cluster_dimension for c in gemm_candidates.screen(clusters=False)} == {None}
    for c in configs:
        assert smem_bytes(c, 2) <= hardware.SMEM_BYTES_PER_CTA
        assert config_from_fields(json.loads(json.dumps(config_fields(c)))) == c


def _fixture_sweep() -> tuple[dict, dict]:
    """A GPU sweep's JSON, made up: two shapes, each with a best config that no heuristic picks."""
    a = TuningConfig(tile_m=128, tile_n=128, wg_dimension=MatmulDimension.M,
                     max_concurrent_steps=3, grid_tile_width=16)
    b = TuningConfig(tile_m=64, tile_n=256, wg_dimension=MatmulDimension.M,
                     max_concurrent_steps=3, epi_tile_n=128, grid_minor_dim=MatmulDimension.N)
    configs = {gemm_candidates.name(c): config_fields(c) for c in (a, b)}
    shapes = [dict(shape=[8192, 4096, 6144], best=gemm_candidates.name(a), ratio=0.991),
              dict(shape=[4096, 1024, 2048], best=gemm_candidates.name(b), ratio=1.012),
              dict(shape=[4096, 2048, 1024], status="untimed", results={})]
    meta = dict(command="python -m bench.gemm_sweep --out /o", date="2026-12-01T15:00:00+00:00",
                device="NVIDIA H200", sms=hardware.H200_SMS, commit="abc1234", platform="gpu",
                quick=False)
    return dict(meta=meta, configs=configs, shapes=shapes), dict(a=a, b=b)


def _load_table(path):
    spec = importlib.util.spec_from_file_location("written_gemm_configs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_written_table_is_what_default_config_looks_up(tmp_path, monkeypatch):
    doc, picks = _fixture_sweep()
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert gemm_sweep.main(["--write-table", str(tmp_path / "r.json"),
                            "--table-out", str(tmp_path / "t.py")]) == 0
    table = _load_table(tmp_path / "t.py")
    assert table.PROVENANCE == {k: doc["meta"][k]
                                for k in ("command", "date", "device", "sms", "commit")}
    assert [shape for shape, _ in table.ENTRIES] == [(8192, 4096, 6144), (4096, 1024, 2048)]
    heuristic = {s: gemm_config.default_config(*s[:2], (s[2],))
                 for s in [(8192, 4096, 6144), (512, 4096, 6144), (4096, 1024, 2048)]}
    monkeypatch.setattr(gemm_configs, "ENTRIES", table.ENTRIES)
    monkeypatch.setattr(gemm_configs, "PROVENANCE", table.PROVENANCE)
    lookup = gemm_config.default_config
    assert lookup(8192, 4096, (6144,)) == picks["a"]
    assert lookup(16384, 4096, (6144,)) == picks["a"]  # a factor 2 in M away
    assert lookup(8192, 4096, (4096, 1024, 1024)) == picks["a"]  # weights' N concatenated
    assert lookup(2048, 1024, (2048,)) == picks["b"]
    assert lookup(4096, 1536, (2048,)) == picks["b"]  # nearer b than a
    # Far from every entry, on another GPU, or at decode: the heuristic.
    assert lookup(512, 4096, (6144,)) == heuristic[(512, 4096, 6144)]
    assert lookup(8192, 4096, (6144,), sms=114) != picks["a"]
    assert lookup(64, 4096, (6144,)).tile_m == 64
    assert lookup(4096, 1024, (2048,), itemsize=4) != picks["b"]  # measured in bf16


def test_a_later_sweep_overrides_the_shapes_it_measured(tmp_path):
    first, picks = _fixture_sweep()
    later = json.loads(json.dumps(first))
    later["meta"].update(command="python -m bench.gemm_sweep --screen-all", commit="def5678",
                         date="2026-12-04T12:00:00+00:00")
    later["shapes"] = [row for row in later["shapes"] if row["shape"] == [4096, 1024, 2048]]
    (row,) = later["shapes"]
    other = next(name for name in later["configs"] if name != row["best"])
    row.update(best=other, ratio=0.95)
    paths = [tmp_path / "first.json", tmp_path / "later.json"]
    for path, doc in zip(paths, (first, later)):
        path.write_text(json.dumps(doc))
    assert gemm_sweep.main(["--write-table", *map(str, paths),
                            "--table-out", str(tmp_path / "t.py")]) == 0
    table = _load_table(tmp_path / "t.py")
    entries = dict(table.ENTRIES)
    assert config_from_fields(entries[(8192, 4096, 6144)]) == picks["a"]
    assert entries[(4096, 1024, 2048)] == later["configs"][other]
    assert table.PROVENANCE["commit"] == "abc1234; def5678"
    assert table.PROVENANCE["date"] == "2026-12-04T12:00:00+00:00"


def test_table_needs_a_gpu_sweep(tmp_path):
    doc, _ = _fixture_sweep()
    doc["meta"].update(platform="cpu", quick=True)
    with pytest.raises(ValueError, match="GPU sweep"):
        gemm_table_writer.table_source([doc])


def test_lookup_drops_a_cluster_where_tiles_do_not_pair_up(monkeypatch):
    clustered = TuningConfig(cluster_dimension=MatmulDimension.N, max_concurrent_steps=3)
    monkeypatch.setattr(gemm_configs, "ENTRIES", (((8192, 4096, 6144), config_fields(clustered)),))
    monkeypatch.setattr(gemm_configs, "PROVENANCE", dict(sms=hardware.H200_SMS))
    assert gemm_config.default_config(8192, 4096, (4096, 1024, 1024)) == clustered  # 24 N tiles
    odd = gemm_config.default_config(8192, 4096, (5888,))  # 23 N tiles of 256
    assert odd == dataclasses.replace(clustered, cluster_dimension=None)


def test_around_table_times_each_pick_and_its_in_flight_variants(tmp_path):
    doc = _run(tmp_path, "--shapes", "128x64x512,64x64x128", "--around-table")
    for row in doc["shapes"]:
        m, k, n = row["shape"]
        pick = gemm_config.default_config(m, k, (n,))
        expected = {gemm_candidates.name(c)
                    for c in [pick, *gemm_candidates.in_flight_variants(pick)]}
        assert set(row["results"]) == expected and row["status"] == "timed", row
        assert any(name.endswith("_f1") for name in expected)
        for result in row["results"].values():
            assert result["status"] == "ok" and result["rel_error"] <= gemm_sweep.REL_TOL
    assert "carried_configs" not in doc["meta"]


def test_in_flight_variants_fit_and_keep_the_tiles():
    for config in gemm_candidates.screen():
        variants = gemm_candidates.in_flight_variants(config)
        assert variants and all(v.wgmma_in_flight == 1 and gemm_candidates.fits(v)
                                for v in variants)
        assert all((v.tile_m, v.tile_n, v.cluster_dimension)
                   == (config.tile_m, config.tile_n, config.cluster_dimension) for v in variants)


def test_screen_all_screens_every_listed_shape(tmp_path):
    doc = _run(tmp_path, "--shapes", "128x64x512,64x64x128", "--screen-all")
    for row in doc["shapes"]:
        assert row["status"] == "timed"
        assert len(row["results"]) > 1 + gemm_sweep.QUICK_PLAN.max_screen, row["shape"]


def test_pingpong_times_each_pick_and_its_pingpong_variants(tmp_path):
    doc = _run(tmp_path, "--shapes", "128x64x512", "--pingpong")
    (row,) = doc["shapes"]
    pick = gemm_config.default_config(128, 64, (512,))
    variants = gemm_candidates.pingpong_variants(pick)
    assert len(variants) == 2 * len(gemm_candidates.PINGPONG_TILES)
    assert all(v.pingpong and v.cluster_dimension is None and gemm_candidates.fits(v)
               for v in variants)
    assert set(row["results"]) == {gemm_candidates.name(c) for c in [pick, *variants]}
    for result in row["results"].values():
        assert result["status"] == "ok" and result["rel_error"] <= gemm_sweep.REL_TOL


def test_unmeasured_lists_the_shapes_without_a_table_entry(capsys):
    from pallas_kernels import gemm_configs

    measured = [tuple(shape) for shape, _ in gemm_configs.ENTRIES]
    outside = (96, 160, 224)
    assert gemm_sweep.unmeasured([*measured[:3], outside]) == [outside]
    assert gemm_sweep.main(["--unmeasured", "--shapes", f"{measured[0][0]}x{measured[0][1]}x"
                            f"{measured[0][2]},96x160x224"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == "96x160x224" and parse_mkn(printed) == (outside,)

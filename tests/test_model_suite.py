"""The model suite's code paths on CPU (`--quick`): variants, phases, tables. Timings mean nothing."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rich.console import Console

from bench import model_suite as ms
from bench import summarize


def _logits(model: nnx.Module, tokens: jax.Array) -> np.ndarray:
    return np.asarray(model(tokens)[0], np.float32)


def test_variants_are_one_network_and_the_limit_has_no_norms():
    variants = ms.build_variants(ms.QUICK)
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, ms.QUICK.cfg.vocab_size)
    stock = _logits(variants["stock"], tokens)
    scale = np.max(np.abs(stock))
    for name in ("jaxnorm", "flashified"):  # bf16 logits: a few bf16 roundings apart
        assert np.max(np.abs(_logits(variants[name], tokens) - stock)) <= 0.05 * scale, name
    free = variants["norm-free"]
    assert not any(isinstance(m, nnx.RMSNorm) for _, m in nnx.iter_modules(free))
    assert sum(isinstance(m, ms.Identity) for _, m in nnx.iter_modules(free)) == (
        2 * ms.QUICK.cfg.n_layers + 2 * ms.QUICK.cfg.n_layers + 1)  # in, mlp, q/k per layer; head
    assert np.max(np.abs(_logits(free, tokens) - stock)) > 0.05 * scale


def test_quick_run_measures_every_cell_and_writes_tables(tmp_path):
    cells = ms.run([ms.QUICK], rounds=1, repeats=1, warmup=0, phases=("prefill", "decode"),
                   out=tmp_path)
    assert [c.phase for c in cells] == ["prefill", "decode B=1", "decode B=2"]
    for cell in cells:
        # Decode cells also measure stock with jaxnorm's cache layout.
        control = {ms.LAYOUT_CONTROL} if cell.phase.startswith("decode") else set()
        assert set(cell.rounds[0]) == set(ms.VARIANTS) | control
        for r in cell.rounds[0].values():
            samples, low, high = r["wall_spread_us"]
            assert r["wall_us"] > 0 and samples == 1 and low == high == round(r["wall_us"], 1)
            assert r["wall_samples_us"] == [round(r["wall_us"], 1)]
            assert r["kernel_spread_us"] == [0]  # no CUPTI on CPU
        paired = ms.paired_wall_ratio(cell, 0, "jaxnorm")
        jaxnorm, stock = (cell.rounds[0][v]["wall_samples_us"][0] for v in ("jaxnorm", "stock"))
        assert paired == jaxnorm / stock
    payload = json.loads((tmp_path / "model-suite.json").read_text())
    assert [c.phase for c in ms.from_json(payload)] == [c.phase for c in cells]
    table = (tmp_path / "model-suite.md").read_text()
    # per cell: three metric rows, a paired-wall row per variant but stock, a breakdown row
    # per variant
    assert table.count("| tiny |") == sum(3 + 2 * len(c.rounds[0]) - 1 for c in cells)
    assert summarize._json_section(payload)[0] == table


def test_each_round_measures_the_variants_in_a_rotated_order(monkeypatch):
    """Over as many rounds as variants, each variant is measured once in each position
    (the progress lines say the order), its wall samples taken in turn in that order; the
    results keep the variants' order."""
    monkeypatch.setattr(ms, "_measure", lambda *a, **k: {"wall_us": 1.0, "kernel_us": None,
                                                         "kernels": 0.0})
    wall_orders = []
    monkeypatch.setattr(ms.timing, "interleaved_wall",
                        lambda programs, **k: wall_orders.append(list(programs)) or {
                            v: None for v in programs})
    log = io.StringIO()
    cells = ms.run([ms.QUICK], rounds=len(ms.VARIANTS), repeats=1, warmup=0,
                   phases=("prefill",), console=Console(file=log, width=200))
    lines = [line.split(": ")[-1] for line in log.getvalue().splitlines() if " round " in line]
    n = len(ms.VARIANTS)
    orders = [lines[i * n:(i + 1) * n] for i in range(n)]
    assert orders[0] == list(ms.VARIANTS) and orders[1] == list(ms.VARIANTS[1:] + ms.VARIANTS[:1])
    for position in range(n):
        assert sorted(o[position] for o in orders) == sorted(ms.VARIANTS)
    assert [list(r) for r in cells[0].rounds] == [list(ms.VARIANTS)] * n
    assert wall_orders == orders


def test_detail_writes_each_variants_kernels_and_its_timed_program(tmp_path):
    """--detail, round 1 only: per variant the kernels by name (here none: no CUPTI on CPU)
    and the HLO of the program the kernels were timed in."""
    ms.run([ms.QUICK], rounds=2, repeats=1, warmup=0, phases=("prefill",), out=tmp_path,
           detail=tmp_path / "detail")
    names = sorted(p.name for p in (tmp_path / "detail").iterdir())
    assert names == sorted(f"tiny-prefill-{v}.{kind}" for v in ms.VARIANTS
                           for kind in ("kernels.json", "hlo.txt"))
    kernels = json.loads((tmp_path / "detail" / "tiny-prefill-stock.kernels.json").read_text())
    assert kernels == {"launches_per_call": 0, "kernels": []}
    hlo = (tmp_path / "detail" / "tiny-prefill-stock.hlo.txt").read_text()
    assert hlo.startswith("HloModule") and "ENTRY" in hlo


def test_kernels_by_name_sum_each_names_launches():
    kernels = [("gemm_a", 2.0), ("fusion_1", 0.5), ("gemm_a", 3.0)]
    assert ms._by_name(kernels) == {"gemm_a": (2, 5.0), "fusion_1": (1, 0.5)}
    assert ms._top(kernels, 1) == [("gemm_a", 5.0)]


def test_train_step_reaches_every_parameter():
    """One AdamW step: a finite loss, and every parameter's first moment (its gradient
    scaled by 1 - b1) is non-zero (bf16 weights may not move visibly in one step)."""
    model = ms.build_variants(ms.QUICK)["jaxnorm"]
    fn, arg_sets = ms.train_case(model, ms.QUICK, copies=1)
    loss, _, opt_state = jax.jit(fn)(*arg_sets[0])
    assert np.isfinite(float(loss)) and float(loss) > 0
    first_moments = jax.tree.leaves(opt_state[0].mu)
    assert len(first_moments) == len(jax.tree.leaves(arg_sets[0][0]))
    assert all(bool(jnp.any(mu != 0)) for mu in first_moments)


def test_gap_closed():
    assert ms.gap_closed(100.0, 95.0, 90.0) == 0.5
    assert ms.gap_closed(100.0, 102.0, 90.0) == -0.2
    assert ms.gap_closed(100.0, 95.0, 100.0) is None  # no gap to close


def test_kernel_classes():
    assert ms.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert ms.kernel_class("mosaic_gpu_lazy_rms_matmul") == "mosaic"
    assert ms.kernel_class("input_reduce_fusion_3") == "norm/reduction"
    assert ms.kernel_class("loop_multiply_fusion") == "elementwise"
    assert ms.kernel_class("copy_fusion") == "copy"


def test_bounded_limit_is_a_fifth_variant_with_its_own_gap_column(tmp_path):
    cells = ms.run([ms.QUICK], rounds=2, repeats=1, warmup=0, phases=("prefill",),
                   out=tmp_path, bounded=True)
    assert list(cells[0].rounds[0]) == [*ms.VARIANTS, ms.BOUNDED]
    table = (tmp_path / "model-suite.md").read_text()
    header = table.splitlines()[0]
    assert f"| {ms.BOUNDED} |" in header and f"gap closed to {ms.BOUNDED} (rounds)" in header
    stock, jaxnorm, limit = (ms._metric(cells[0], 0, v, "wall_us")
                             for v in ("stock", "jaxnorm", ms.BOUNDED))
    expected = ms.gap_closed(stock, jaxnorm, limit)
    assert ms._gaps(cells[0], "wall_us", ms.BOUNDED)[0] == (
        "n/a" if expected is None else f"{100 * expected:.0f}%")
    assert json.loads((tmp_path / "model-suite.json").read_text())["variants"][-1] == ms.BOUNDED


def test_paired_quartiles_are_those_of_the_per_pass_ratios():
    cell = ms.Cell("m", "prefill", "1x1", 1, [{
        "stock": {"wall_samples_us": [10.0, 10.0, 10.0, 10.0, 10.0]},
        "jaxnorm": {"wall_samples_us": [9.0, 10.0, 11.0, 12.0, 8.0]}}])
    assert ms.paired_wall_quartiles(cell, 0, "jaxnorm") == pytest.approx((0.9, 1.0, 1.1))
    assert ms.paired_wall_ratio(cell, 0, "jaxnorm") == pytest.approx(1.0)
    cell.rounds[0]["jaxnorm"] = {"wall_us": 9.0}  # a record from before samples were kept
    assert ms.paired_wall_quartiles(cell, 0, "jaxnorm") is None


def test_a_cell_out_of_device_memory_is_recorded_and_the_run_goes_on(monkeypatch, tmp_path):
    """A cell whose variants do not fit the device (RESOURCE_EXHAUSTED) is left out with its
    reason, in the JSON, the table and the progress lines; the cells after it are measured."""
    monkeypatch.setattr(ms, "_measure", lambda *a, **k: {
        "wall_us": 1.0, "kernel_us": None, "kernels": 0.0, "by_class_us": {}})

    def wall(programs, **kw):
        if any(v == ms.LAYOUT_CONTROL for v in programs) and not wall.failed:
            wall.failed = True
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying "
                                             "to allocate 512.00MiB\nallocator summary")
        return {v: None for v in programs}

    wall.failed = False
    monkeypatch.setattr(ms.timing, "interleaved_wall", wall)
    log = io.StringIO()
    cells = ms.run([ms.QUICK], rounds=1, repeats=1, warmup=0, phases=("prefill", "decode"),
                   out=tmp_path, console=Console(file=log, width=300))
    assert [c.phase for c in cells] == ["prefill", "decode B=2"]
    payload = json.loads((tmp_path / "model-suite.json").read_text())
    assert payload["skipped"] == [{"model": "tiny", "phase": "decode B=1", "reason":
                                   "RESOURCE_EXHAUSTED: Out of memory while trying to "
                                   "allocate 512.00MiB"}]
    assert "decode B=1: not measured, out of device memory" in log.getvalue()
    table = (tmp_path / "model-suite.md").read_text()
    assert "Not measured: tiny decode B=1 (RESOURCE_EXHAUSTED" in table
    assert summarize._json_section(payload)[0] == table


def test_other_runtime_errors_are_not_swallowed(monkeypatch):
    def wall(programs, **kw):
        raise jax.errors.JaxRuntimeError("INTERNAL: an unspecified launch failure")

    monkeypatch.setattr(ms.timing, "interleaved_wall", wall)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        ms.run([ms.QUICK], rounds=1, repeats=1, warmup=0, phases=("prefill",),
               console=Console(file=io.StringIO()))


def test_a_run_measures_only_the_variants_it_is_given(tmp_path):
    """Fewer variants resident (an 80 GB card holding three decode caches, not five): the
    cells hold those alone, and the table marks the others not measured."""
    cells = ms.run([ms.QUICK], rounds=1, repeats=1, warmup=0, phases=("prefill", "decode"),
                   out=tmp_path, variants=("stock", "jaxnorm", "norm-free"),
                   console=Console(file=io.StringIO()))
    assert [set(c.rounds[0]) for c in cells] == [{"stock", "jaxnorm", "norm-free"}] * 3
    row = next(line for line in (tmp_path / "model-suite.md").read_text().splitlines()
               if line.startswith("| tiny | prefill | 2x16 | kernels |"))
    stock, jaxnorm, flashified, free = row.split(" | ")[4:8]
    assert flashified == "-" and "-" not in (stock, jaxnorm, free)


@pytest.mark.parametrize("variants, message", [
    (("stock", "flashified"), r"must include \['jaxnorm'\]"),
    (("stock", "jaxnorm", ms.BOUNDED), "not built by this run"),
])
def test_variants_a_run_cannot_measure_are_a_value_error(variants, message):
    with pytest.raises(ValueError, match=message):
        ms.run([ms.QUICK], rounds=1, repeats=1, warmup=0, phases=("prefill",),
               variants=variants, console=Console(file=io.StringIO()))

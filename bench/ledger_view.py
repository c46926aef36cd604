"""The ledger suite: roofline predictions as tables, before anything is measured.

Pure Python (no JAX import), so it runs anywhere in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench import ledger, shapes
from bench.presets import ModelPreset
from bench.report import TextTable, fmt


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}"


def _us(seconds: float) -> str:
    return fmt(seconds * 1e6)


def decode_op_table(
    p: ModelPreset, batches: Sequence[int], context: int, ceilings: ledger.Ceilings
) -> TextTable:
    """Per op: share of the decode step's roofline time, unfused vs fused, per batch."""
    steps = {
        (b, fused): ledger.decode_step(p, b, context, fused=fused)
        for b in batches
        for fused in (False, True)
    }
    seconds = {key: ledger.op_seconds(ops, ceilings) for key, ops in steps.items()}
    totals = {key: sum(s.values()) for key, s in seconds.items()}
    reference = steps[(batches[0], False)]
    rows = []
    for op in reference:
        row = [op.name, op.category]
        for key in steps:
            row.append(_pct(seconds[key].get(op.name, 0.0), totals[key]))
        rows.append(row)
    rows.append(["step time (us)", ""] + [_us(totals[key]) for key in steps])
    kernels = [str(ledger.kernel_count(ops)) for ops in steps.values()]
    rows.append(["kernels per step", "", *kernels])
    headers = ["op", "category"] + [
        f"B={b} {'fused' if fused else 'unfused'} %" for b, fused in steps
    ]
    title = f"{p.name}: decode step at L={context}, share of roofline time per op"
    return TextTable(title, headers, rows, left_columns=2)


def decode_summary(
    presets: Sequence[ModelPreset], batches: Sequence[int], context: int, ceilings: ledger.Ceilings
) -> TextTable:
    """Per preset and batch: step time, and the shares of norms and other elementwise work."""
    rows = []
    for p in presets:
        for b in batches:
            line = [p.name, str(b)]
            per_mode = []
            for fused in (False, True):
                ops = ledger.decode_step(p, b, context, fused=fused)
                by_category = ledger.category_seconds(ops, ceilings)
                total = sum(by_category.values())
                per_mode.append((total, by_category, ledger.kernel_count(ops)))
            line += [_us(t) for t, _, _ in per_mode]
            line += [_pct(c.get(ledger.NORM, 0.0), t) for t, c, _ in per_mode]
            line += [_pct(c.get(ledger.ELEMENTWISE, 0.0), t) for t, c, _ in per_mode]
            line += [str(k) for _, _, k in per_mode]
            rows.append(line)
    headers = [
        "preset", "B", "step us unfused", "step us fused", "norms % unfused", "norms % fused",
        "other elementwise % unfused", "other elementwise % fused", "kernels unfused",
        "kernels fused",
    ]  # fmt: skip
    return TextTable(f"Decode step at L={context}: summary", headers, rows)


def prefill_table(
    presets: Sequence[ModelPreset], tokens: int, ceilings: ledger.Ceilings
) -> TextTable:
    """Per preset: what a layer's separate norms cost at prefill, and what fusion hides."""
    rows = []
    for p in presets:
        unfused = ledger.prefill_layer(p, tokens, fused=False)
        fused = ledger.prefill_layer(p, tokens, fused=True)
        t_unfused = ledger.step_seconds(unfused, ceilings)
        t_fused = ledger.step_seconds(fused, ceilings)
        norm_unfused = ledger.category_seconds(unfused, ceilings)[ledger.NORM]
        norm_fused = ledger.category_seconds(fused, ceilings).get(ledger.NORM, 0.0)
        hidden = _pct(norm_unfused - norm_fused, norm_unfused)
        unfused_cols = [_us(t_unfused), _us(norm_unfused), _pct(norm_unfused, t_unfused)]
        rows.append([p.name, *unfused_cols, _us(t_fused), hidden])
    headers = [
        "preset", "layer us unfused", "separate norms us", "norms % of layer",
        "layer us fused", "norm time hidden %",
    ]  # fmt: skip
    return TextTable(f"Prefill layer, M={tokens} tokens (one causal sequence)", headers, rows)


def norm_gemm_table(
    ms: Sequence[int], kns: shapes.KNs, ceilings: ledger.Ceilings
) -> TextTable:
    """The norm-gemm suite's shapes as predicted: what the GPU run will be compared with."""
    rows = []
    for k, ns in kns:
        for m in ms:
            gemm = ledger.step_seconds(ledger.gemm_ops(m, k, ns), ceilings)
            unfused = ledger.step_seconds(ledger.norm_gemm_ops(m, k, ns, fused=False), ceilings)
            fused = ledger.step_seconds(ledger.norm_gemm_ops(m, k, ns, fused=True), ceilings)
            widths = "+".join(str(n) for n in ns)
            times = [_us(gemm), _us(unfused - gemm), _us(unfused), _us(fused)]
            ratios = [f"{unfused / gemm:.3f}", f"{fused / gemm:.3f}"]
            rows.append([f"{m}x{k}x{widths}", *times, *ratios])
    headers = [
        "M x K x N", "GEMM(s) us", "norm us", "unfused us", "fused us", "unfused / GEMM",
        "fused / GEMM",
    ]  # fmt: skip
    return TextTable("norm-gemm suite shapes: roofline prediction (RMSNorm)", headers, rows)


def headlines(
    presets: Sequence[ModelPreset],
    batches: Sequence[int],
    context: int,
    tokens: int,
    ceilings: ledger.Ceilings,
) -> list[str]:
    """One line per preset: the numbers the report leads with."""
    lines = []
    for p in presets:
        unfused = ledger.prefill_layer(p, tokens, fused=False)
        t = ledger.step_seconds(unfused, ceilings)
        norms = ledger.category_seconds(unfused, ceilings)[ledger.NORM]
        parts = [f"{p.name}: prefill M={tokens}: separate norms {100 * norms / t:.2f}% of a layer"]
        for b in batches:
            shares = []
            for fused in (False, True):
                by_category = ledger.category_seconds(
                    ledger.decode_step(p, b, context, fused=fused), ceilings
                )
                total = sum(by_category.values())
                norm = by_category.get(ledger.NORM, 0.0)
                other = by_category[ledger.ELEMENTWISE]
                shares.append(f"{100 * norm / total:.3f}% + {100 * other / total:.3f}%")
            parts.append(f"decode B={b} norms + other elementwise {shares[0]} -> fused {shares[1]}")
        kernels = [
            ledger.kernel_count(ledger.decode_step(p, 1, context, fused=f)) for f in (False, True)
        ]
        parts.append(f"kernels/step {kernels[0]} -> {kernels[1]}")
        lines.append("; ".join(parts))
    return lines

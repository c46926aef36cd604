"""The GPU suites: which cases each sweeps, running them, writing their results.

Every implementation of a case is timed on the same rotating inputs, in the
same process as the ceilings its roofline percentages divide by. A case an
implementation cannot serve becomes a row saying why; nothing aborts the sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import ledger, report, residual_gemm, shapes, timing, tiny_model
from bench.cases import Case
from bench.ceilings import measure_ceilings
from bench.impls import REGISTRY, Impl
from bench.presets import PRESETS, TINY


class NoGPU(RuntimeError):
    """The GPU suites need a CUDA device visible to JAX."""


@dataclass(frozen=True)
class Options:
    quick: bool = False
    ms: tuple[int, ...] | None = None
    kns: tuple[str, ...] | None = None
    impls: tuple[str, ...] | None = None
    norms: tuple[str, ...] | None = None
    """None: RMSNorm for the GEMM suites, RMSNorm and LayerNorm for `norms`."""
    presets: tuple[str, ...] | None = None
    """None: every preset but the tiny one."""
    repeats: int = 30
    warmup: int = 3


def _norm_gemm(o: Options) -> list[Case]:
    ms = shapes.M_QUICK if o.quick else shapes.M_ALL
    kns = shapes.NORM_GEMM_KNS_QUICK if o.quick else shapes.NORM_GEMM_KNS
    return [
        Case("norm_gemm", m, k, ns, norm, label=norm)
        for norm in o.norms or ("rms",)
        for k, ns in kns
        for m in ms
    ]


def _post_norm(o: Options) -> list[Case]:
    ms = shapes.M_QUICK if o.quick else shapes.M_ALL
    kns = shapes.POST_NORM_KNS[:2] if o.quick else shapes.POST_NORM_KNS
    after_ms = (4096,) if o.quick else shapes.POST_NORM_ADD_MS
    after = [Case("gemm_norm_add", m, k, ns, label="+r after")
             for k, ns in shapes.POST_NORM_ADD_KNS for m in after_ms]
    return [Case("gemm_norm", m, k, ns) for k, ns in kns for m in ms] + after


def _norms(o: Options) -> list[Case]:
    ms = shapes.M_QUICK if o.quick else shapes.M_ALL
    return [
        Case("norm", m, k, norm=norm, label=norm)
        for norm in o.norms or ("rms", "layer")
        for k in shapes.NORM_KS
        for m in ms
    ]


def _decode_step(o: Options) -> list[Case]:
    ms = shapes.DECODE_M_QUICK if o.quick else shapes.DECODE_M
    names = o.presets or tuple(name for name in PRESETS if name != TINY.name)
    return [
        Case(op, m, k, ns, label=f"{name} {projection}")
        for name in names
        for projection, op, k, ns in shapes.decode_projections(PRESETS[name])
        for m in ms
    ]


def _train_step(o: Options) -> list[Case]:
    ms = shapes.TRAIN_M_QUICK if o.quick else shapes.TRAIN_M
    return [Case("train", m, k, ns) for k, ns in shapes.TRAIN_KNS for m in ms]


SUITES: dict[str, Callable[[Options], list[Case]]] = {
    "norm-gemm": _norm_gemm,
    "post-norm": _post_norm,
    "norms": _norms,
    "decode-step": _decode_step,
    "train-step": _train_step,
    "residual-gemm": lambda o: residual_gemm.cases(o.quick),
}


def select_cases(suite: str, o: Options) -> list[Case]:
    return [
        c
        for c in SUITES[suite](o)
        if (o.ms is None or c.m in o.ms) and (o.kns is None or c.kn in o.kns)
    ]


def require_gpu() -> str:
    """The GPU's name, or NoGPU with what JAX said."""
    import jax

    try:
        return jax.devices("gpu")[0].device_kind
    except RuntimeError as err:
        raise NoGPU(f"no GPU visible to JAX ({err})") from None


def _failure(err: Exception) -> tuple[str, str]:
    status = "unavailable" if isinstance(err, (ImportError, NotImplementedError)) else "error"
    return status, f"{type(err).__name__}: {err}"


def _base_row(suite: str, case: Case, impl: Impl, ceilings: ledger.Ceilings) -> dict[str, Any]:
    ideal = case.ledger_ops(fused=True, gemm_only=impl.gemm_only)
    cost = ledger.total_cost(ideal)
    unfused = None
    if not impl.gemm_only and case.op != "norm":
        unfused = ledger.step_seconds(case.ledger_ops(fused=False), ceilings) * 1e6
    return {
        "suite": suite,
        "op": case.op,
        "label": case.label,
        "shape": case.shape,
        "m": case.m,
        "k": case.k,
        "ns": list(case.ns),
        "norm": case.norm,
        "impl": impl.name,
        "gemm_only": impl.gemm_only,
        "flops": cost.flops,
        "bytes": cost.moves * ledger.BF16_BYTES,
        "roofline_us": ledger.step_seconds(ideal, ceilings) * 1e6,
        "roofline_unfused_us": unfused,
        "status": "ok",
        "error": "",
    }


def _timed(row: dict[str, Any], t: timing.Timing, ceilings: ledger.Ceilings) -> dict[str, Any]:
    best = t.best_us
    row |= dataclasses.asdict(t)
    row["best_us"] = best
    if row.get("bytes"):
        row["pct_roofline"] = 100 * row["roofline_us"] / best
        row["tflops"] = row["flops"] / best / 1e6
        row["gbps"] = row["bytes"] / best / 1e3
        row["pct_hbm"] = 100 * row["gbps"] * 1e9 / ceilings.hbm_bytes_per_s
    return row


def _model_rows(suite: str, o: Options, ceilings: ledger.Ceilings) -> list[dict[str, Any]]:
    """A tiny model's training step (`bench.tiny_model`), stock Flax vs jaxnorm layers."""
    rows = []
    for variant in tiny_model.VARIANTS:
        row: dict[str, Any] = {
            "suite": suite,
            "op": "model_train",
            "label": "tiny model",
            "shape": "",
            "impl": variant,
            "roofline_us": None,
            "status": "ok",
            "error": "",
        }
        try:
            step, args = tiny_model.tiny_train_step(variant)
            rows.append(_timed(row, timing.measure(step, [args], repeats=o.repeats), ceilings))
        except Exception as err:  # a failing variant is a row, not a crash
            row["status"], row["error"] = _failure(err)
            rows.append(row)
    return rows


def run_suite(
    suite: str, o: Options, ceilings: ledger.Ceilings, console: Console
) -> list[dict[str, Any]]:
    """Every selected case under every registered implementation of its op."""
    cases = select_cases(suite, o)
    plan = [
        (case, [impl for name, impl in REGISTRY[case.op].items() if not o.impls or name in o.impls])
        for case in cases
    ]
    rows = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[now]}"),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(suite, total=sum(len(impls) for _, impls in plan), now="")
        for case, impls in plan:
            arg_sets = None
            for impl in impls:
                progress.update(task, now=f"{case.label} {case.shape} {impl.name}".strip())
                row = _base_row(suite, case, impl, ceilings)
                try:
                    fn = impl.build(case)
                    if arg_sets is None:
                        copies = timing.rotation_copies(case.set_bytes())
                        arg_sets = [case.inputs(seed) for seed in range(copies)]
                    t = timing.measure(fn, arg_sets, repeats=o.repeats, warmup=o.warmup)
                    row = _timed(row, t, ceilings)
                except Exception as err:  # one failing kernel must not end the sweep
                    row["status"], row["error"] = _failure(err)
                rows.append(row)
                progress.advance(task)
            del arg_sets  # free this case's copies before the next case allocates
    if suite == "train-step":
        rows += _model_rows(suite, o, ceilings)
    return rows


def write_suite(
    suite: str,
    rows: list[dict[str, Any]],
    out: Path,
    env: dict[str, Any],
    ceilings: ledger.Ceilings,
    ceiling_timings: dict[str, Any],
    args: dict[str, Any],
) -> list[Path]:
    """JSON (every raw number), Markdown, and the plots; returns the files written."""
    hidden = report.hidden_fractions(rows)
    payload = {
        "suite": suite,
        "env": env,
        "args": args,
        "ceilings": dataclasses.asdict(ceilings),
        "ceiling_timings": ceiling_timings,
        "rows": rows,
        "hidden_fraction": hidden,
    }
    written = [out / f"{suite}.json", out / f"{suite}.md", out / f"{suite}-roofline.png"]
    report.write_json(written[0], payload)
    tables = [report.results_table(suite, rows)]
    if hidden:
        title = f"{suite}: share of XLA's separate-norm time hidden by jaxnorm"
        headers = ["case", "(t_xla - t_jaxnorm) / (t_xla - t_xla_dot)"]
        body = [[name, report.fmt(v, 2)] for name, v in hidden.items()]
        tables.append(report.TextTable(title, headers, body))
    preamble = [
        f"- devices: {env['devices']}; driver: {env['driver']}; jax {env['jax']};"
        f" {env['date_utc']}",
        f"- HBM copy bandwidth {ceilings.hbm_bytes_per_s / 1e12:.3f} TB/s, bf16 GEMM "
        f"{ceilings.gemm_flops_per_s / 1e12:.1f} TFLOP/s ({ceilings.source})",
        "- times are medians; kernel = CUPTI kernel time, wall = per call incl. launch;"
        " % roofline = ledger bound / kernel time (wall where CUPTI failed)",
        f"- {suite}-roofline.png: {report.ROOFLINE_CAPTION}",
        *([f"- {suite}-hidden.png: {report.HIDDEN_CAPTION}"] if hidden else []),
    ]
    report.write_markdown(written[1], f"bench: {suite}", preamble, tables)
    report.plot_roofline(rows, ceilings, written[2])
    if hidden:
        written.append(out / f"{suite}-hidden.png")
        report.plot_hidden(rows, written[-1])
    return written


def run(names: list[str], o: Options, out: Path, console: Console, args: dict[str, Any]) -> None:
    """Measure the ceilings once, then each suite; write every suite's files into `out`."""
    gpu = require_gpu()
    out.mkdir(parents=True, exist_ok=True)
    env = report.environment()
    console.print(f"GPU: {gpu}; measuring the ceilings (HBM copy, bf16 8192^3 GEMM)...")
    ceilings, ceiling_timings = measure_ceilings(o.repeats)
    console.print(
        f"HBM {ceilings.hbm_bytes_per_s / 1e12:.3f} TB/s, GEMM "
        f"{ceilings.gemm_flops_per_s / 1e12:.1f} TFLOP/s"
    )
    for suite in names:
        rows = run_suite(suite, o, ceilings, console)
        report.print_tables([report.results_table(suite, rows)], console)
        for path in write_suite(suite, rows, out, env, ceilings, ceiling_timings, args):
            console.print(f"wrote {path}")

"""Where a model step's GPU sits idle: its kernels on the device timeline, and the gaps
between them, by the kernel that waited.

A step's wall time exceeds its CUPTI kernel time (bench/results, the model suite) by the
time the GPU spends between kernels. This traces a few calls of each variant (the model
suite's, or bench/gpu/variant_probe.py's, such as "gated declined") with
`jax.profiler.trace`, reads the device's kernel events from the trace (the streams of
/device:GPU:0), and reports per call: the span from the first kernel's start to the last
one's end, the busy time (the union of kernel intervals), the idle time between them,
the delay from the call's host dispatch to its first kernel; and the idle time summed by
the kernel that started after each gap (names with their numeric suffix removed), so
a variant that waits before its custom calls, or its copies, shows it by name; on the
host, the events between each dispatch and its first kernel and the first call's CUDA
graph launches. Host times are traced ones (profiling changes them; compare variants
with the model suite's untraced wall time before acting on them). Usage:
python bench/gpu/timeline_probe.py --model gemma3-1b --phase train --variants stock,jaxnorm \
    --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import jax

from bench import model_suite
from bench.gpu import variant_probe

GPU_PROCESS = re.compile(r"/device:GPU:\d+")
CALL_EVENT = re.compile(r"^PjitFunction\(")  # the host's dispatch of a jitted call
# The host's launches: CUDA graphs (XLA's command buffers) and single kernels.
LAUNCH_EVENT = re.compile(r"cuGraphLaunch|command_buffer_\d+$|cuLaunchKernel", re.I)


def kernel_family(name: str) -> str:
    """A kernel's name without XLA's numeric suffix: fusion_212 and fusion_108 are 'fusion'."""
    return re.sub(r"([._]\d+)+$", "", name)


def trace_events(trace: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """(kernel events on the GPU's streams, host events that dispatch a jitted call, every
    host event), each a complete event {'name', 'ts', 'dur'} in microseconds, sorted by
    start."""
    processes, threads = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e["pid"], e.get("tid")] = e.get("args", {}).get("name", "")
    kernels, calls, host = [], [], []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e:
            continue
        process = processes.get(e["pid"], "")
        thread = threads.get((e["pid"], e.get("tid")), "")
        event = {"name": e.get("name", ""), "ts": float(e["ts"]), "dur": float(e["dur"])}
        if GPU_PROCESS.search(process) and thread.lower().startswith("stream"):
            kernels.append(event)
        elif not GPU_PROCESS.search(process):
            host.append(event)
            if CALL_EVENT.search(event["name"]):
                calls.append(event)
    outermost = []  # one event per call: drop those nested in the previous one
    for call in sorted(calls, key=lambda e: e["ts"]):
        if not outermost or call["ts"] >= outermost[-1]["ts"] + outermost[-1]["dur"]:
            outermost.append(call)
    by_start = lambda e: e["ts"]
    return sorted(kernels, key=by_start), outermost, sorted(host, key=by_start)


def idle_by_kernel(kernels: Sequence[dict]) -> tuple[float, float, dict[str, list[float]]]:
    """(busy us, idle us, {family: [gaps, idle us]}) over kernels sorted by start: a gap is
    the time from the latest end so far to the next kernel's start, charged to that kernel."""
    if not kernels:
        return 0.0, 0.0, {}
    busy = idle = 0.0
    by_family: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    end = kernels[0]["ts"]
    for k in kernels:
        start, stop = k["ts"], k["ts"] + k["dur"]
        if start > end:
            idle += start - end
            entry = by_family[kernel_family(k["name"])]
            entry[0] += 1
            entry[1] += start - end
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy, idle, dict(by_family)


def per_call(kernels: Sequence[dict], calls: Sequence[dict]) -> list[dict]:
    """Each traced call's kernels (those starting after its dispatch and before the next
    call's): span, busy, idle, the delay from dispatch to the first kernel, kernel count."""
    rows = []
    for i, call in enumerate(calls):
        upto = calls[i + 1]["ts"] if i + 1 < len(calls) else float("inf")
        mine = [k for k in kernels if call["ts"] <= k["ts"] < upto]
        if not mine:
            continue
        busy, idle, _ = idle_by_kernel(mine)
        span = max(k["ts"] + k["dur"] for k in mine) - mine[0]["ts"]
        rows.append({"kernels": len(mine), "span_us": round(span, 1), "busy_us": round(busy, 1),
                     "idle_us": round(idle, 1),
                     "dispatch_to_first_kernel_us": round(mine[0]["ts"] - call["ts"], 1)})
    return rows


def host_before_first_kernel(kernels: Sequence[dict], calls: Sequence[dict],
                             host: Sequence[dict]) -> dict[str, list[float]]:
    """{host event name: [count, us]} per call, of the host events that start between a
    call's dispatch and its first kernel (inclusive times: nested events count in each)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    counted = 0
    for call in calls:
        first = next((k["ts"] for k in kernels if k["ts"] >= call["ts"]), None)
        if first is None:
            continue
        counted += 1
        for e in host:
            if call["ts"] <= e["ts"] < first:
                totals[e["name"]][0] += 1
                totals[e["name"]][1] += min(e["dur"], first - e["ts"])
    return {name: [n / counted, us / counted] for name, (n, us) in totals.items()}


def launches(calls: Sequence[dict], host: Sequence[dict], limit: int = 300) -> list[dict]:
    """The first call's launch events on the host, in order: name, start after the
    dispatch, duration (us), so a CUDA graph's size and its launch cost show together."""
    if not calls:
        return []
    call = calls[0]
    return [{"event": e["name"], "at_us": round(e["ts"] - call["ts"], 1),
             "us": round(e["dur"], 1)}
            for e in host if call["ts"] <= e["ts"] < call["ts"] + call["dur"]
            and LAUNCH_EVENT.search(e["name"])][:limit]


def summarize(trace: dict, top: int = 25) -> dict:
    """The trace's per-call rows, the idle time by kernel family and the host's events before
    each call's first kernel (largest first)."""
    kernels, calls, host = trace_events(trace)
    _, idle, by_family = idle_by_kernel(kernels)
    ranked = sorted(by_family.items(), key=lambda kv: -kv[1][1])[:top]
    before = sorted(host_before_first_kernel(kernels, calls, host).items(),
                    key=lambda kv: -kv[1][1])[:top]
    return {"calls": per_call(kernels, calls), "kernel_events": len(kernels),
            "idle_us_total": round(idle, 1),
            "idle_by_next_kernel": [{"kernel": k, "gaps": int(n), "idle_us": round(t, 1)}
                                    for k, (n, t) in ranked],
            "host_before_first_kernel": [{"event": k, "count": round(n, 1), "us": round(t, 1)}
                                         for k, (n, t) in before],
            "first_call_launches": launches(calls, host)}


def traced(fn: Callable, args: tuple, calls: int) -> tuple[dict, list[float]]:
    """The profiler's trace of `calls` dispatches of fn(*args) (already compiled), and the
    wall time of each (under the profiler, so only for comparison between variants)."""
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # Python's own events would inflate the host's time
        with jax.profiler.trace(tmp, profiler_options=options):
            for _ in range(calls):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                walls.append((time.perf_counter() - start) * 1e6)
        (path,) = Path(tmp).glob("plugins/profile/*/*.trace.json.gz")
        with gzip.open(path) as f:
            return json.load(f), walls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-1b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--phase", default="train", choices=("train", "prefill"))
    parser.add_argument("--variants", default="stock,jaxnorm")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    shape = model_suite.QUICK if args.model == "tiny" else model_suite.SHAPES[args.model]
    case = (model_suite.train_case if args.phase == "train" else model_suite.prefill_case)
    labels = args.variants.split(",")
    known = (*model_suite.VARIANTS, *variant_probe.EXTRA)
    unknown = [v for v in labels if v not in known]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(known)}")
    variants = variant_probe.probe_variants(shape, lambda m: case(m, shape, 1), labels)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": shape.name, "phase": args.phase, "device": str(jax.devices()[0]),
              "variants": {}}
    for label in labels:
        model, fn = variants[label]
        arg_sets = case(model, shape, 1)[1]
        jitted = jax.jit(fn)
        for _ in range(3):  # compile, warm up
            jax.block_until_ready(jitted(*arg_sets[0]))
        trace, walls = traced(jitted, arg_sets[0], args.calls)
        summary = summarize(trace)
        summary["wall_us_under_profiler"] = [round(w, 1) for w in walls]
        result["variants"][label] = summary
        calls = summary["calls"]
        print(f"{label}: {summary['kernel_events']} kernel events, calls "
              + "; ".join(f"span {c['span_us']} busy {c['busy_us']} idle {c['idle_us']} "
                          f"first {c['dispatch_to_first_kernel_us']}" for c in calls), flush=True)
        for row in summary["idle_by_next_kernel"][:8]:
            print(f"    {row['idle_us']:9.1f} us in {row['gaps']:4d} gaps before {row['kernel']}",
                  flush=True)
        for row in summary["host_before_first_kernel"][:12]:
            print(f"    host before the first kernel: {row['us']:9.1f} us in {row['count']:6.1f}"
                  f" x {row['event'][:90]}", flush=True)
        graphs = [e for e in summary["first_call_launches"] if "cuGraphLaunch" in e["event"]]
        print(f"    {len(graphs)} graph launches in call 1: " + ", ".join(
            f"{e['event'].split('(')[-1].rstrip(')')} at {e['at_us']} for {e['us']} us"
            for e in graphs[:20]), flush=True)
        del arg_sets
    (out / f"timeline-{shape.name}-{args.phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

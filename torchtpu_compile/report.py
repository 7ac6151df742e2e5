"""A compile report for humans: one HTML page from a run's structured trace (``TORCH_TRACE``).

It reads the artifacts torchtpu writes there (``profiling.ARTIFACTS``) and shows, per graph,
compile time by stage, the cache levels that answered, bucket decisions and their padding,
the ops that fell back to eager PyTorch and why, and the largest programs, with plots drawn by
plotly, whose JavaScript is inlined: the page opens from disk, with no server and no network.

The structured trace records compiles, not steps. Given a profiler trace of the same run as
well (``--trace-json``: ``torch.profiler``'s Chrome trace, merged with the device's events by
``profiling.DeviceEvents``), the page also plots the time of each step (PyTorch's
``ProfilerStep#N`` spans, one per ``prof.step()`` under a ``schedule``) and device memory
over time (the "tpu memory" counter track: bytes of live PJRT buffers), the steps marked.

Usage::

    TORCH_TRACE=/tmp/trace python train.py
    python -m torchtpu_compile.report /tmp/trace            # writes /tmp/trace/torchtpu_report.html
    python -m torchtpu_compile.report /tmp/trace -o report.html
    python -m torchtpu_compile.report /tmp/trace --trace-json profile.json   # steps, memory

The folder's newest log is read (the last run); a log file may be given instead. Without an
argument, ``$TORCH_TRACE`` is the folder. plotly comes with the ``report`` (and ``test``) extra:
``pip install 'torchtpu[report]'``.

Example::

    from torchtpu_compile.report import read_trace, render
    html = render(read_trace("/tmp/trace"))
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import html
import json
import os
import sys

#: The sections of the page, in order (their ids: the test checks each renders).
SECTIONS = ("summary", "compile-time", "caches", "buckets", "fallbacks", "largest", "steps",
            "memory")


@dataclasses.dataclass
class Trace:
    """torchtpu's artifacts of one run: ``programs`` (``torchtpu_program`` records),
    ``buckets`` and ``fallbacks`` (their artifacts), ``frames`` (the compile id each program
    was built under, by program name) and ``source`` (the log read)."""

    source: str
    programs: list = dataclasses.field(default_factory=list)
    buckets: list = dataclasses.field(default_factory=list)
    fallbacks: list = dataclasses.field(default_factory=list)
    frames: dict = dataclasses.field(default_factory=dict)


def _log_of(path: str) -> str:
    if os.path.isdir(path):
        logs = glob.glob(os.path.join(path, "*.log"))
        if not logs:
            raise FileNotFoundError(f"no trace log in {path}: run with TORCH_TRACE={path}")
        return max(logs, key=os.path.getmtime)
    return path


def _entries(log_path: str):
    """(header, payload) of each structured-trace entry: a glog line ending in a JSON header,
    then its payload's lines, each after a tab."""
    header, payload = None, []
    with open(log_path, errors="replace") as lines:
        for line in lines:
            if line.startswith("\t"):
                payload.append(line[1:])
                continue
            if header is not None:
                yield header, "".join(payload)
            header, payload = None, []
            _, sep, rest = line.partition("] ")
            if sep:
                try:
                    header = json.loads(rest)
                except ValueError:
                    header = None
    if header is not None:
        yield header, "".join(payload)


def read_trace(path: str) -> Trace:
    """torchtpu's artifacts from a TORCH_TRACE folder (its newest log) or log file.

    Example::

        trace = read_trace("/tmp/trace")
        [p["name"] for p in trace.programs]      # ['graph_0/forward', 'graph_0/backward']
    """
    log_path = _log_of(path)
    trace = Trace(source=log_path)
    for header, payload in _entries(log_path):
        name = (header.get("artifact") or {}).get("name")
        if name not in ("torchtpu_program", "torchtpu_bucket", "torchtpu_fallbacks"):
            continue
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        if name == "torchtpu_program":
            trace.programs.append(value)
            if "frame_id" in header:
                trace.frames[value["name"]] = f"{header['frame_id']}/{header['frame_compile_id']}"
        elif name == "torchtpu_bucket":
            trace.buckets.append(value)
        else:
            trace.fallbacks.append(value)
    return trace


@dataclasses.dataclass
class Profile:
    """What the page plots from a profiler trace: ``steps`` ((step number, start ms, duration
    ms), from PyTorch's ``ProfilerStep#N`` spans) and ``memory`` ((ms, live device bytes), the
    "tpu memory" counter track), times from the trace's first event; ``source``: the file."""

    source: str
    steps: list = dataclasses.field(default_factory=list)
    memory: list = dataclasses.field(default_factory=list)


#: The counter track ``profiling.DeviceEvents.merge_into`` writes, and its value's name.
MEMORY_TRACK, MEMORY_VALUE = "tpu memory", "allocated bytes"
_STEP = "ProfilerStep#"


def read_profile(path: str) -> Profile:
    """Steps and device memory from a Chrome trace (``prof.export_chrome_trace`` then
    ``DeviceEvents.merge_into``).

    Example::

        profile = read_profile("trace.json")
        [number for number, _, _ in profile.steps]     # [0, 1, 2]
    """
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    origin = min(times) if times else 0.0
    steps = {}
    memory = []
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith(_STEP) and name[len(_STEP):].isdigit():
            # PyTorch writes a step's span on the CPU track and, with a device, once more
            # there: the CPU one (the first) times the step as the program saw it.
            steps.setdefault(int(name[len(_STEP):]),
                             ((e["ts"] - origin) / 1e3, e.get("dur", 0) / 1e3))
        elif e.get("ph") == "C" and name == MEMORY_TRACK:
            memory.append(((e["ts"] - origin) / 1e3, e["args"][MEMORY_VALUE]))
    return Profile(source=path, steps=[(n, *steps[n]) for n in sorted(steps)],
                   memory=sorted(memory))


def _table(columns: list, rows: list) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


class _Plots:
    """plotly figures as HTML; the first carries plotly's JavaScript, inlined."""

    def __init__(self):
        self.inlined = False

    def __call__(self, figure) -> str:
        figure.update_layout(height=360, margin=dict(l=40, r=20, t=40, b=120))
        out = figure.to_html(full_html=False, include_plotlyjs=not self.inlined,
                             config={"displaylogo": False})
        self.inlined = True
        return f'<div class="plot">{out}</div>'


def _seconds(program: dict) -> tuple:
    s = program.get("seconds", {})
    lowering, xla = s.get("lowering_seconds", 0.0), s.get("xla_compile_seconds", 0.0)
    return lowering, xla, max(s.get("total", 0.0) - lowering - xla, 0.0)


def render(trace: Trace, profile: Profile | None = None) -> str:
    """The report page for ``trace`` (``read_trace``), as one self-contained HTML string;
    with ``profile`` (``read_profile``), step times and memory over time too."""
    import plotly.graph_objects as go

    plot = _Plots()
    programs = trace.programs
    names = [p["name"] for p in programs]
    sections = []

    total = sum(p.get("seconds", {}).get("total", 0.0) for p in programs)
    sections.append(("summary", "Summary", _table(["what", "value"], [
        ("trace", trace.source), ("programs built", len(programs)),
        ("build seconds (all programs)", total),
        ("graphs with fallbacks", len(trace.fallbacks)),
        ("bucket decisions", len(trace.buckets)),
        ("precisions", ", ".join(sorted({p.get("precision", "?") for p in programs})))])))

    stages = [_seconds(p) for p in programs]
    figure = go.Figure([go.Bar(name=stage, x=names, y=[s[i] for s in stages])
                        for i, stage in enumerate(("lowering", "XLA compile", "other"))])
    figure.update_layout(barmode="stack", title="Compile seconds per program, by stage",
                         yaxis_title="seconds")
    rows = [(p["name"], trace.frames.get(p["name"], "-"), p.get("precision"), p.get("kind"),
             *s, p.get("seconds", {}).get("total", 0.0)) for p, s in zip(programs, stages)]
    sections.append(("compile-time", "Compile time by graph", plot(figure) + _table(
        ["program", "frame", "precision", "kind", "lowering s", "XLA compile s", "other s",
         "total s"], rows)))

    cache_rows = []
    for p in programs:
        for cache, levels in sorted(p.get("cache_hits", {}).items()):
            hit = [level for level in ("process", "disk", "remote") if levels.get(level)]
            cache_rows.append((p["name"], cache, ", ".join(hit) or "-",
                               "yes" if levels.get("miss") else "no"))
    sections.append(("caches", "Cache levels hit", _table(
        ["program", "cache", "hit at", "missed (built)"], cache_rows)))

    if trace.buckets:
        labels = [f"{b['graph']} {b['sizes']}→{b['bucket']}" for b in trace.buckets]
        waste = [b["padded_elements"] - b["real_elements"] for b in trace.buckets]
        figure = go.Figure([go.Bar(name="real", x=labels,
                                   y=[b["real_elements"] for b in trace.buckets]),
                            go.Bar(name="padding", x=labels, y=waste)])
        figure.update_layout(barmode="stack", title="Elements per bucket decision: real and "
                             "padding", yaxis_title="elements")
        body = plot(figure) + _table(
            ["graph", "dims", "sizes", "bucket", "buckets before", "real elements",
             "padding elements"],
            [(b["graph"], b["dims"], b["sizes"], b["bucket"], b["buckets_before"],
              b["real_elements"], w) for b, w in zip(trace.buckets, waste)])
    else:
        body = "<p>No bucket decisions: every graph had static shapes.</p>"
    sections.append(("buckets", "Buckets and padding", body))

    rows = [(f["graph"], op["op"], op["node"], op["reason"])
            for f in trace.fallbacks for op in f["ops"]]
    sections.append(("fallbacks", "Ops run in eager PyTorch", _table(
        ["graph", "op", "call", "reason"], rows) if rows else
        "<p>No fallbacks: every op went through XLA.</p>"))

    largest = sorted((p for p in programs if p.get("stablehlo_chars")),
                     key=lambda p: -p["stablehlo_chars"])[:20]
    figure = go.Figure([go.Bar(x=[p["name"] for p in largest],
                               y=[p["stablehlo_chars"] for p in largest])])
    figure.update_layout(title="Largest programs (StableHLO characters)")
    sections.append(("largest", "Largest programs", plot(figure) + _table(
        ["program", "StableHLO characters", "fingerprint"],
        [(p["name"], p["stablehlo_chars"], p.get("fingerprint", "")[:16]) for p in largest])))

    sections += _profile_sections(profile, plot, go)

    body = "".join(f'<section id="{sid}"><h2>{html.escape(title)}</h2>{content}</section>'
                   for sid, title, content in sections)
    return _PAGE.format(source=html.escape(trace.source), body=body)


_NO_PROFILE = ("<p>No profiler trace given: run the steps under <code>torch.profiler</code> "
               "with a <code>schedule</code> (calling <code>prof.step()</code> after each) and "
               "<code>profiling.DeviceEvents</code>, export the Chrome trace and pass it with "
               "<code>--trace-json</code>.</p>")
MB = 1 << 20


def _profile_sections(profile: Profile | None, plot, go) -> list:
    """The "steps" and "memory" sections, from a profiler trace (or what to do without one)."""
    if profile is None:
        return [("steps", "Step time", _NO_PROFILE), ("memory", "Device memory over time",
                                                      _NO_PROFILE)]
    if profile.steps:
        figure = go.Figure([go.Scatter(x=[n for n, _, _ in profile.steps],
                                       y=[d for _, _, d in profile.steps],
                                       mode="lines+markers", name="step")])
        figure.update_layout(title="Time per step (ProfilerStep spans)", xaxis_title="step",
                             yaxis_title="ms")
        durations = sorted(d for _, _, d in profile.steps)
        steps = plot(figure) + _table(["what", "value"], [
            ("steps", len(durations)), ("median step ms", durations[len(durations) // 2]),
            ("first step ms", profile.steps[0][2]), ("slowest step ms", durations[-1])]) + \
            _table(["step", "start ms", "duration ms"], profile.steps)
    else:
        steps = (f"<p>No ProfilerStep spans in {html.escape(profile.source)}: give the "
                 f"profiler a <code>schedule</code> and call <code>prof.step()</code> after "
                 f"each step.</p>")
    if profile.memory:
        figure = go.Figure([go.Scatter(x=[t for t, _ in profile.memory],
                                       y=[b / MB for _, b in profile.memory],
                                       mode="lines", line_shape="hv", name=MEMORY_TRACK)])
        for number, start, _ in profile.steps:  # where each step begins
            figure.add_vline(x=start, line_dash="dot", line_color="gray",
                             annotation_text=str(number))
        figure.update_layout(title="Live device memory (MB) over time; dotted: step starts",
                             xaxis_title="ms", yaxis_title="MB")
        peak = max(b for _, b in profile.memory)
        memory = plot(figure) + _table(["what", "value"], [
            ("samples", len(profile.memory)), ("peak MB", peak / MB),
            ("at end MB", profile.memory[-1][1] / MB)])
    else:
        memory = (f'<p>No "{MEMORY_TRACK}" counter in {html.escape(profile.source)}: merge '
                  f"the device's events into it (<code>DeviceEvents.merge_into</code>).</p>")
    return [("steps", "Step time", steps), ("memory", "Device memory over time", memory)]


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>torchtpu compile report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-size: 90%; }}
section {{ margin-bottom: 2em; }}
</style></head>
<body><h1>torchtpu compile report</h1><p>From {source}</p>
{body}
</body></html>
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchtpu_compile.report",
                                     description="One HTML page from a TORCH_TRACE run.")
    parser.add_argument("trace", nargs="?", default=os.environ.get("TORCH_TRACE"),
                        help="a TORCH_TRACE folder (its newest log) or log file "
                             "(default: $TORCH_TRACE)")
    parser.add_argument("-o", "--output", help="the page to write (default: "
                        "torchtpu_report.html next to the trace)")
    parser.add_argument("--trace-json", help="a profiler trace of the run (torch.profiler's "
                        "Chrome trace, merged by profiling.DeviceEvents): plots step time and "
                        "device memory over time")
    args = parser.parse_args(argv)
    if not args.trace:
        parser.error("give a TORCH_TRACE folder (or set TORCH_TRACE)")
    try:
        trace = read_trace(args.trace)
        profile = read_profile(args.trace_json) if args.trace_json else None
    except FileNotFoundError as exc:
        parser.error(str(exc))
    except (ValueError, KeyError) as exc:
        parser.error(f"{args.trace_json} is not a Chrome trace (torch.profiler's "
                     f"export_chrome_trace): {exc}")
    output = args.output or os.path.join(os.path.dirname(trace.source), "torchtpu_report.html")
    with open(output, "w") as out:
        out.write(render(trace, profile))
    print(f"torchtpu: wrote {output} ({len(trace.programs)} programs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

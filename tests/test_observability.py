"""torchtpu in PyTorch's profiler and structured trace (torchtpu_compile/profiling.py).

The profiled runs check both what the spans say (names, order, nesting, byte counts) and that
the profiled computation still gives eager PyTorch's values on the CPU.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchtpu_compile
from tests.support.helpers import compile_tpu
from tests.test_fallback import UNLOWERABLE, UnlowerableNet
from torchtpu_compile import config


@pytest.fixture(autouse=True)
def fresh_stats():
    torchtpu_compile.reset_stats()
    with config.patch(matmul_precision="highest"):
        yield


def _ours(prof) -> list:
    """torchtpu's spans, in the order they started: (name, start us, end us, args)."""
    spans = [(e.name, e.time_range.start, e.time_range.end, e)
             for e in prof.profiler.function_events if e.name.startswith("torchtpu::")]
    return sorted(spans, key=lambda s: (s[1], -s[2]))


def _first(spans: list, name: str):
    found = [s for s in spans if s[0] == name]
    assert found, f"no span {name!r} among {sorted({s[0] for s in spans})}"
    return found[0]


def _inside(inner, outer) -> bool:
    return outer[1] <= inner[1] and inner[2] <= outer[2]


@pytest.mark.cold_cache  # a lowering span and compile seconds: a warm cache lowers nothing
def test_profiled_compiled_training_step_shows_compile_run_and_transfers_in_order():
    torch.manual_seed(0)
    model = torch.nn.Linear(13, 7)  # shapes of its own: its lowering is no earlier test's
    reference = torch.nn.Linear(13, 7)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(5, 13)
    compiled = compile_tpu(model)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        compiled(x).relu().pow(2).mean().backward()
    reference(x).relu().pow(2).mean().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)

    spans = _ours(prof)
    graphs = torchtpu_compile.stats()["graphs"]
    forward = next(name for name in graphs if name.endswith("/forward"))
    backward = forward.replace("forward", "backward")
    backend = _first(spans, "torchtpu::backend_compile")
    aot = _first(spans, "torchtpu::aot_autograd")
    build = _first(spans, f"torchtpu::build {forward}")
    lowering, xla = _first(spans, "torchtpu::lowering"), _first(spans, "torchtpu::xla_compile")
    run_fw = _first(spans, f"torchtpu::run {forward}")
    run_bw = _first(spans, f"torchtpu::run {backward}")
    # The compile nests as it runs: backend > aot_autograd > build > lowering, then XLA.
    assert _inside(aot, backend) and _inside(build, aot)
    assert _inside(lowering, build) and _inside(xla, build) and lowering[2] <= xla[1]
    # Then the step: the forward program's run, then the backward's, each with its transfers
    # and an execution that waited for the results.
    assert backend[2] <= run_fw[1] < run_bw[1]
    for run in (run_fw, run_bw):
        executes = [s for s in spans if s[0] == "torchtpu::execute" and _inside(s, run)]
        assert len(executes) == 1
    uploads = [s for s in spans if s[0] == "torchtpu::upload" and _inside(s, run_fw)]
    assert x.nbytes in [int(s[3].kwinputs["bytes"]) for s in uploads]
    # key_averages() names them as stats() does.
    keys = {event.key for event in prof.key_averages()}
    assert {f"torchtpu::run {forward}", f"torchtpu::run {backward}",
            "torchtpu::cache executable", "torchtpu::cache executable miss"} <= keys


def test_profiled_eager_loop_shows_each_op_its_program_and_the_download():
    x = torch.randn(6, 3)
    y = x.to("tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            y = y * 2 + 1
        host = y.cpu()
    expected = x
    for _ in range(3):
        expected = expected * 2 + 1
    torch.testing.assert_close(host, expected)

    spans = _ours(prof)
    ops = [s for s in spans if s[0].startswith("torchtpu::eager ")]
    assert [s[0] for s in ops] == \
        ["torchtpu::eager aten.mul.Tensor", "torchtpu::eager aten.add.Tensor"] * 3 + \
        ["torchtpu::eager aten._to_copy.default"]   # .cpu()
    for op in ops[:-1]:  # each op ran its program, to completion, inside its own span
        runs = [s for s in spans if s[0].startswith("torchtpu::run ") and _inside(s, op)]
        executes = [s for s in spans if s[0] == "torchtpu::execute" and _inside(s, op)]
        assert len(runs) == 1 and len(executes) == 1
    [download] = [s for s in spans if s[0] == "torchtpu::download"]
    assert _inside(download, ops[-1]) and download[1] >= ops[-2][2]


def test_xla_events_merge_into_the_chrome_trace_inside_their_execution(tmp_path):
    from torchtpu_compile.profiling import DeviceEvents
    x = torch.randn(64, 64)
    compiled = compile_tpu(lambda t: (t @ t).sin() + 1)
    torch.testing.assert_close(compiled(x), (x @ x).sin() + 1, rtol=1e-5, atol=1e-5)
    with profile(activities=[ProfilerActivity.CPU]) as prof, DeviceEvents() as xla:
        compiled(x)
        compiled(x)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    assert xla.merge_into(path) > 0
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    executes = [(e["ts"], e["ts"] + e["dur"]) for e in events
                if e.get("name") == "torchtpu::execute"]
    device = [e for e in events if e.get("cat") == "xla"]
    assert len(executes) == 2 and device
    program = next(name for name in torchtpu_compile.stats()["graphs"])
    for event in device:  # XLA's work sits inside the span of the execution that ran it
        assert any(start <= event["ts"] and event["ts"] + event["dur"] <= end
                   for start, end in executes), event
        assert event["args"]["program"] == program
    # Both runs show device work.
    assert all(any(start <= e["ts"] <= end for e in device) for start, end in executes)


def test_memory_timeline_follows_allocations_and_frees(tmp_path):
    from torchtpu_compile.profiling import DeviceEvents
    from torchtpu_compile.runtime import memory
    host_a, host_b = torch.randn(1000), torch.randn(500)
    gc.collect()  # earlier tests' buffers die now, not inside the timeline
    gc.disable()
    try:
        base = memory.snapshot()["allocated_bytes"]
        with profile(activities=[ProfilerActivity.CPU]) as prof, DeviceEvents() as device:
            a = host_a.to("tpu")
            b = host_b.to("tpu")
            del a
    finally:
        gc.enable()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    device.merge_into(path)
    with open(path) as f:
        samples = [e for e in json.load(f)["traceEvents"] if e.get("name") == "tpu memory"]
    live = [e["args"]["allocated bytes"] - base for e in sorted(samples, key=lambda e: e["ts"])]
    assert live == [host_a.nbytes, host_a.nbytes + host_b.nbytes, host_b.nbytes]
    torch.testing.assert_close(b.cpu(), host_b)


PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, as the Chrome trace writes a device type


def test_profile_memory_records_tpu_allocations_and_frees(tmp_path):
    # profile_memory=True: each PJRT buffer made and freed is a "[memory]" event of the tpu
    # device (PrivateUse1), whose running total is the live buffer bytes runtime/memory.py
    # counts at that moment (the figure torch.tpu.memory_allocated() reports).
    from torchtpu_compile.runtime import memory
    host_a, host_b = torch.randn(1000), torch.randn(500)
    gc.collect()  # earlier tests' buffers die now, not inside the profile
    gc.disable()
    try:
        base = memory.snapshot()["allocated_bytes"]
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            a = host_a.to("tpu")
            b = host_b.to("tpu")
            live_both = memory.snapshot()["allocated_bytes"]
            del a
            live_end = memory.snapshot()["allocated_bytes"]
    finally:
        gc.enable()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = sorted((e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"
                         and e["args"]["Device Type"] == PRIVATEUSE1), key=lambda e: e["ts"])
    assert [e["args"]["Bytes"] for e in events] == [host_a.nbytes, host_b.nbytes, -host_a.nbytes]
    assert [e["args"]["Total Allocated"] for e in events] == [
        base + host_a.nbytes, live_both, live_end]
    assert live_end - base == host_b.nbytes
    torch.testing.assert_close(b.cpu(), host_b)


def test_profiled_fallback_is_a_span_of_its_own():
    x = torch.randn(2, 6)
    model = UnlowerableNet()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model.to("tpu")(x.to("tpu")).cpu()
    torch.testing.assert_close(out, model.to("cpu")(x))
    names = {s[0] for s in _ours(prof)}
    assert f"torchtpu::fallback {UNLOWERABLE}" in names


def test_no_span_outside_the_profiler():
    # The sites check the profiler before anything else: outside it, nothing is recorded and
    # executions are not waited for (a span helper would leave its reentry flag behind).
    from torchtpu_compile import profiling
    compiled = compile_tpu(lambda t: t * 3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pass
    torch.testing.assert_close(compiled(torch.ones(4)), torch.full((4,), 3.0))
    assert not _ours(prof)
    assert not getattr(profiling._local, "inner", False)


# --- TORCH_TRACE ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """PyTorch's structured trace (as TORCH_TRACE writes it) of three compiled functions: a
    static graph, a graph with an op that falls back, and a graph bucketed at two sizes."""
    from torch._logging._internal import LazyTraceHandler, TorchLogsFormatter, trace_log
    folder = tmp_path_factory.mktemp("torch_trace")
    handler = LazyTraceHandler(str(folder))
    handler.setFormatter(TorchLogsFormatter(trace=True))
    level = trace_log.level
    trace_log.setLevel(logging.DEBUG)
    trace_log.addHandler(handler)
    try:
        with config.patch(matmul_precision="highest"):
            x = torch.randn(3, 11)
            torch.testing.assert_close(compile_tpu(lambda t: t.sin() * 5)(x), x.sin() * 5)
            model = UnlowerableNet()
            inputs = torch.randn(2, 6)
            torch.testing.assert_close(compile_tpu(model)(inputs), model(inputs))
            dynamic = compile_tpu(lambda t: t.cos().sum(1))
            for width in (5, 40):  # two buckets
                t = torch.randn(2, width)
                torch._dynamo.mark_dynamic(t, 1)
                torch.testing.assert_close(dynamic(t), t.cos().sum(1))
    finally:
        trace_log.removeHandler(handler)
        handler.close()
        trace_log.setLevel(level)
    return folder


def _artifacts(folder) -> list:
    """(name, payload) of each artifact in the trace logs of ``folder``, in order."""
    found = []
    for file in sorted(os.listdir(folder)):
        if not file.endswith(".log"):
            continue
        with open(os.path.join(folder, file)) as lines:
            name, payload = None, []
            for line in list(lines) + ["END] {}"]:
                if line.startswith("\t"):
                    payload.append(line[1:])
                    continue
                if name is not None:
                    found.append((name, "".join(payload)))
                header = json.loads(line.split("] ", 1)[1])
                name = header.get("artifact", {}).get("name")
                payload = []
    return found


@pytest.mark.cold_cache  # xla_compile_seconds > 0: a warm cache compiles nothing
def test_torch_trace_holds_programs_fallbacks_and_buckets(traced_run):
    artifacts = _artifacts(traced_run)
    programs = [json.loads(p) for n, p in artifacts if n == "torchtpu_program"]
    static = programs[0]  # the first graph: t.sin() * 5
    assert static["precision"] == "highest" and static["kind"] == "Program"
    assert static["seconds"]["xla_compile_seconds"] > 0
    assert static["cache_hits"]["executable"]["miss"] == 1
    texts = [p for n, p in artifacts if n == "torchtpu_stablehlo"]
    assert any("stablehlo.sine" in t and "11xf32" in t for t in texts)
    [fallbacks] = [json.loads(p) for n, p in artifacts if n == "torchtpu_fallbacks"]
    assert [op["op"] for op in fallbacks["ops"]] == [UNLOWERABLE]
    assert fallbacks["ops"][0]["reason"]
    buckets = [json.loads(p) for n, p in artifacts if n == "torchtpu_bucket"]
    assert [b["sizes"] for b in buckets] == [[5], [40]]
    assert all(b["bucket"][0] >= b["sizes"][0] for b in buckets)
    assert buckets[0]["padded_elements"] == 2 * buckets[0]["bucket"][0]
    assert buckets[0]["real_elements"] == 2 * 5


def test_tlparse_renders_our_artifacts_per_frame(traced_run, tmp_path):
    tlparse = shutil.which("tlparse") or os.path.join(os.path.dirname(sys.executable),
                                                      "tlparse")
    out = tmp_path / "tlparse"
    [log] = [f for f in os.listdir(traced_run) if f.endswith(".log")]
    subprocess.run([tlparse, str(traced_run / log), "-o", str(out), "--no-browser"],
                   check=True, capture_output=True, timeout=120)
    rendered = {name for _, _, files in os.walk(out) for name in files}
    for artifact in ("torchtpu_program", "torchtpu_stablehlo", "torchtpu_fallbacks",
                     "torchtpu_bucket"):
        assert any(name.startswith(artifact + "_") for name in rendered), artifact
    assert "torchtpu_program" in (out / "index.html").read_text()


def test_report_page_shows_each_graph_bucket_and_fallback(traced_run, tmp_path):
    from torchtpu_compile import report
    page = tmp_path / "report.html"
    assert report.main([str(traced_run), "-o", str(page)]) == 0
    text = page.read_text()
    trace = report.read_trace(str(traced_run))
    assert len(trace.programs) >= 3
    for section in report.SECTIONS:
        assert f'<section id="{section}">' in text
    for program in trace.programs:
        assert program["name"] in text
    assert UNLOWERABLE in text
    assert "<td>[5]</td>" in text and "<td>[40]</td>" in text  # the two bucket decisions
    assert text.count('class="plotly-graph-div"') == 3  # compile time, buckets, largest
    assert "<script src=" not in text  # plotly inlined: opens with no network


def test_report_plots_step_time_and_memory_from_a_profiler_trace(traced_run, tmp_path):
    # Three profiled steps of an eager tpu loop, each growing the live device memory; the
    # page's figures must be the trace's own: each step's span and the memory counter's peak.
    from torchtpu_compile import report
    from torchtpu_compile.profiling import DeviceEvents
    kept = []
    # A schedule makes prof.step() record its ProfilerStep span (without one it does not).
    steps = torch.profiler.schedule(wait=0, warmup=0, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=steps) as prof, \
            DeviceEvents() as device:
        for i in range(3):
            kept.append(torch.full((1000 * (i + 1),), float(i)).to("tpu") * 2)
            prof.step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    device.merge_into(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    page = tmp_path / "report.html"
    assert report.main([str(traced_run), "--trace-json", str(path), "-o", str(page)]) == 0
    text = page.read_text()
    for section in report.SECTIONS:
        assert f'<section id="{section}">' in text
    spans = sorted((e["name"], e["dur"]) for e in events
                   if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    assert [name for name, _ in spans] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    steps = text.split('<section id="steps">')[1].split("</section>")[0]
    memory = text.split('<section id="memory">')[1].split("</section>")[0]
    for name, dur in spans:  # one row per step: its number and its duration in ms
        number = int(name.split("#")[1])
        assert f"<tr><td>{number}</td>" in steps and f"<td>{dur / 1e3:.3f}</td>" in steps
    samples = [e["args"]["allocated bytes"] for e in events if e.get("name") == "tpu memory"]
    assert samples and f"<tr><td>peak MB</td><td>{max(samples) / (1 << 20):.3f}</td>" in memory
    assert 'class="plotly-graph-div"' in steps and 'class="plotly-graph-div"' in memory
    assert text.count('class="plotly-graph-div"') == 5    # the three before, steps, memory
    del kept


def test_report_says_how_to_get_steps_without_a_profiler_trace(traced_run, tmp_path):
    from torchtpu_compile import report
    page = tmp_path / "report.html"
    assert report.main([str(traced_run), "-o", str(page)]) == 0
    steps = page.read_text().split('<section id="steps">')[1].split("</section>")[0]
    assert "--trace-json" in steps and "plotly-graph-div" not in steps

"""docs/coverage.md from the sweep's results: OpInfo per path and dtype, and the model zoo.

Usage (from the repository root)::

    python -m tests.support.opinfo.report                      # build/coverage/*.json
    python -m tests.support.opinfo.report --opinfo a.json --zoo z.json --out docs/coverage.md

Results of several runs are merged (a later file wins for the same entry, path and dtype), so
the dtypes (fp32, bf16, c64), or shards, can run separately.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import sys

COLUMNS = [(path, dtype) for path in ("compile", "eager", "fuse")
           for dtype in ("fp32", "bf16", "c64")]
STATUSES = ("pass", "fallback", "fail", "skip", "n/a")


def load_opinfo(files: list) -> tuple:
    """{(op, path, dtype): result} merged over ``files``, and the seconds each file took."""
    merged, seconds = {}, {}
    for name in files:
        with open(name) as f:
            data = json.load(f)
        seconds[name] = data.get("seconds", 0.0)
        for r in data["results"]:
            merged[(r["op"], r["path"], r["dtype"])] = r
    return merged, seconds


def load_zoo(files: list) -> dict:
    """{model: record} merged over ``files``."""
    merged = {}
    for name in files:
        with open(name) as f:
            for record in json.load(f)["models"]:
                merged[record["model"]] = record
    return merged


def dynamic_zoo_section(models: dict) -> list:
    """The zoo's dynamic-length pass (tests/slow/test_zoo_full.py): a paragraph with the
    counts, then one row per text model."""
    counts = collections.Counter(m["status"] for m in models.values())
    per_shape = sorted(n for n, m in models.items() if m["status"] == "per-shape")
    listed = f" ({', '.join(per_shape)})" if per_shape else ""
    calls = max((m.get("calls", 0) for m in models.values()), default=0)
    rows = [f"{len(models)} text models, each compiled once and called at {calls} random "
            f"(batch, sequence) shapes (batch 1..4, sequence 2..48), every output against "
            f"eager's: {counts['pass']} pass (at most one program per bucket for every graph), "
            f"{counts['per-shape']} compile per shape{listed}, {counts['fail']} fail. A model "
            f"that compiles per shape is ours to fix: the "
            f"note names the op without an exact padding rule.", "",
            "| model | status | shapes (batch x seq) | programs per graph / buckets touched | "
            "Dynamo graphs | max error (of scale) | note |",
            "|---|---|---|---|---|---|---|"]
    for name, m in models.items():
        shapes = ", ".join("x".join(map(str, s[0])) for s in m.get("shapes", []) if s)
        programs = ", ".join(f"{c}/{b}" if b else f"{c} (static)"
                             for c, b in zip(m.get("compiles", []), m.get("buckets", []))) or "-"
        err = f"{m['max_err']:.1e}" if "max_err" in m else "-"
        note = "; ".join(_short(r, 200) for r in m.get("reasons", []) + [m.get("error", "")]
                         if r)
        rows.append(f"| {name} | {m['status']} | {shapes} | {programs} | "
                    f"{m.get('graphs', '-')} | {err} | {note} |")
    return rows


def _cell(r) -> str:
    if r is None:
        return "·"
    status = r["status"]
    if status == "pass":
        return "pass"
    if status == "fallback":
        ops = ", ".join(op.removeprefix("aten.").removesuffix(".default")
                        for op in sorted(r["fallback_ops"]))
        return f"falls back ({ops or 'Dynamo'})"
    if status == "skip":
        return f"skip ({r['category']})"
    return status


def totals(results: dict) -> list:
    """Markdown rows: per path and dtype, counts by status and skip category."""
    rows = ["| path | dtype | pass | falls back (xla-unsupported / ours / dynamo) | fail | "
            "skip: xla-unsupported | skip: ours | skip: test-artifact | skip: path unavailable | "
            "entries (n/a excluded) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for path, dtype in COLUMNS:
        rs = [r for (op, p, d), r in results.items() if p == path and d == dtype]
        if not rs:
            continue
        status = collections.Counter(r["status"] for r in rs)
        skip = collections.Counter(r["category"] for r in rs if r["status"] == "skip")
        cause = collections.Counter(r["category"] for r in rs if r["status"] == "fallback")
        counted = len(rs) - status["n/a"]
        fallback = (f"{status['fallback']} ({cause['xla-unsupported']} / {cause['ours']} / "
                    f"{cause['dynamo']})")
        rows.append(f"| {path} | {dtype} | **{status['pass']}** | {fallback} | "
                    f"{status['fail']} | {skip['xla-unsupported']} | {skip['ours']} | "
                    f"{skip['test-artifact']} | {skip['unavailable']} | {counted} |")
    return rows


def fallback_summary(results: dict, limit: int = 40, path_wanted: str = "compile") -> list:
    """The ops that fell back most often on ``path_wanted``, with one reason each."""
    count, why, cause = collections.Counter(), {}, {}
    for (_, path, _), r in results.items():
        if r["status"] != "fallback" or path != path_wanted:
            continue
        for name in r["fallback_ops"] or {"(Dynamo graph break)": r["detail"]}:
            count[name] += 1
            why.setdefault(name, (r["fallback_ops"] or {}).get(name, r["detail"]))
            cause.setdefault(name, r["category"])
    rows = ["| op | entries (all dtypes) | cause | first reason |", "|---|---|---|---|"]
    for name, n in count.most_common(limit):
        rows.append(f"| `{name}` | {n} | {cause[name]} | {_short(why[name], 140)} |")
    return rows


# Error messages name files by absolute path; the table names them from the checkout's root.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))) + os.sep  # tests/support/opinfo/report.py -> the checkout


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).replace(_ROOT, "").split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def entry_table(results: dict) -> list:
    ops = list(dict.fromkeys(op for op, _, _ in results))
    present = [c for c in COLUMNS if any((op, *c) in results for op in ops)]
    header = "| entry | " + " | ".join(f"{p} {d}" for p, d in present) + " |"
    rows = [header, "|---|" + "---|" * len(present)]
    for op in sorted(ops):
        cells = [_cell(results.get((op, p, d))) for p, d in present]
        rows.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return rows


def details(results: dict) -> list:
    """Every entry that did not pass on the compile path, with its full reason."""
    rows = ["| entry | path | dtype | status | category | reason |", "|---|---|---|---|---|---|"]
    for (op, path, dtype), r in sorted(results.items()):
        if r["status"] in ("pass", "n/a") or r["category"] == "unavailable":
            continue
        rows.append(f"| `{op}` | {path} | {dtype} | {r['status']} | {r['category']} | "
                    f"{_short(r['detail'], 220)} |")
    return rows


def _phase(phase: dict) -> str:
    status = phase.get("status", "?")
    if status == "fallback":
        return "falls back"
    return status


def zoo_table(models: dict) -> list:
    rows = ["| model | family | params | inference | training | max error inference / "
            "training (of scale) | tolerance | Dynamo graphs / breaks | fallback ops | note |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in models.items():
        inf, tr = m["inference"], m["training"]
        errs = " / ".join(f"{p['max_err']:.1e}" if "max_err" in p else "-" for p in (inf, tr))
        graphs = f"{inf.get('graphs', '-')} / {inf.get('graph_breaks', '-')} (inf), " \
                 f"{tr.get('graphs', '-')} / {tr.get('graph_breaks', '-')} (train)"
        fallbacks = sorted(set(inf.get("fallback_ops", {})) | set(tr.get("fallback_ops", {})))
        errors = [_short(p["error"], 160) for p in (inf, tr) if p.get("error")]
        known = zoo_known_failures().get(name, m.get("note", "")) or zoo_steps_note(name)
        note = "; ".join(([f"**{_short(known, 400)}**"] if known else []) + errors)
        rows.append(f"| {name} | {m['family']} | {m.get('params', '-')} | {_phase(inf)} | "
                    f"{_phase(tr)} | {errs} | {tr.get('tolerance', inf.get('tolerance', '-'))} | "
                    f"{graphs} | {', '.join(fallbacks) or '-'} | {note} |")
    return rows


def zoo_known_failures() -> dict:
    """The zoo's known failures with their reasons (tests/support/zoo_check.py), if importable."""
    try:
        from tests.support.zoo_check import KNOWN_FAILURES
    except Exception:  # the report renders from JSON alone, too
        return {}
    return KNOWN_FAILURES


def zoo_names() -> list | None:
    """The models of tests/support/zoo_full.py, or None where it does not import."""
    try:
        from tests.support.zoo_full import ZOO
    except Exception:  # the report renders from JSON alone, too
        return None
    return list(ZOO)


def zoo_paragraph(models: dict, zoo: list | None) -> str:
    """What the zoo table covers: how many models the results hold, of how many the zoo has
    (results from before models were added would otherwise claim a stale count), and which."""
    passing = sum(1 for m in models.values()
                  if m["inference"].get("status") == "pass"
                  and m["training"].get("status") == "pass")
    ran = f"{len(models)} random-init models"
    missing = [name for name in zoo or () if name not in models]
    if zoo is not None:
        ran = f"{len(models)} of the {len(zoo)} random-init models"
    text = (f"{ran} (`tests/support/zoo_full.py`), inference and {3} SGD steps (fewer where the "
            f"note says why), compiled against eager at matmul precision `highest`; {passing} "
            "pass both with no fallback. Errors are max |compiled - eager| over the reference's "
            "max magnitude; training is the worst of first output, losses, gradients and "
            "parameter change.")
    if missing:
        text += (f" Not in these results (the zoo gained them after the run): {', '.join(missing)}"
                 "; `make test-full`, then `make coverage`, adds them.")
    return text


def zoo_steps_note(name: str) -> str:
    """Why a zoo model trains fewer steps than the others (tests/support/zoo_check.py), or ""."""
    try:
        from tests.support.zoo_check import STEPS
    except Exception:  # the report renders from JSON alone, too
        return ""
    return STEPS.get(name, (0, ""))[1]


def modinfo_section(results: dict, seconds: dict | None = None) -> list:
    """The ModuleInfo sweep (modules.py, ``sweep --db modules``): what it runs, its totals and
    every entry that did not pass."""
    timing = ["Sweep time: " + ", ".join(f"{os.path.basename(k)} {v / 60:.1f} min"
                                         for k, v in seconds.items()), ""] if seconds else []
    from .modules import MAX_SAMPLES
    return [
        f"Every entry of PyTorch's `module_db` (its own `nn.Module` test inputs: first "
        f"{MAX_SAMPLES} samples per mode, in training mode, and in eval mode too where the entry "
        "says they differ), fp32, the module built from one seed and deep-copied: one copy in "
        "eager CPU PyTorch, the other compiled (on CPU tensors) or on the `tpu` device (strict "
        "mode, `eager`; defer-and-fuse mode, `fuse`: forward and backward one recording). "
        "Compared: forward outputs, the gradients of parameters and inputs from a random "
        "cotangent, and the parameters and buffers after the call (running statistics); a "
        "sample eager rejects must raise the same exception type. Statuses and tolerances as "
        "OpInfo's; known failures are `KNOWN_FAILURES` in `tests/support/opinfo/modules.py`.",
        "", *totals(results), "", *timing, *details(results), ""]


#: The error sweep's verdicts, worst first, as its table's columns (errors.py).
ERROR_COLUMNS = ("returns-value", "other-error", "dynamo", "pass", "(pass, other message)",
                 "cpu-specific", "construction")


def errors_section(ops: dict, modules: dict, seconds: dict | None = None) -> list:
    """The error-input sweep (errors.py, ``sweep --errors``): inputs per verdict and path, for
    OpInfo's and ModuleInfo's error inputs, then every entry with an input that did not pass."""
    from .errors import totals
    rows = ["| inputs of | path | " + " | ".join(ERROR_COLUMNS) + " | entries |",
            "|---|---|" + "---|" * (len(ERROR_COLUMNS) + 1)]
    for what, results in (("OpInfo", ops), ("ModuleInfo", modules)):
        counts = totals(list(results.values()))
        for path in ("compile", "eager"):
            if path not in counts:
                continue
            entries = sum(1 for (_, p, _) in results if p == path)
            cells = " | ".join(str(counts[path].get(v, 0)) for v in ERROR_COLUMNS)
            rows.append(f"| {what} | {path} | {cells} | {entries} |")
    timing = ["Sweep time: " + ", ".join(f"{os.path.basename(k)} {v / 60:.1f} min"
                                         for k, v in seconds.items()), ""] if seconds else []
    listed = ["| entry | path | status | inputs that did not pass |", "|---|---|---|---|"]
    for (op, path, _), r in sorted({**ops, **modules}.items()):
        if r["status"] not in ("pass", "skip"):
            listed.append(f"| `{op}` | {path} | {r['status']} | {_short(r['detail'], 400)} |")
    return [
        "PyTorch's error inputs (OpInfo's `error_inputs`, ModuleInfo's "
        "`module_error_inputs_func`; `tests/support/opinfo/errors.py`, `sweep --errors`): "
        "inputs eager CPU rejects, each run in eager CPU first (where it does not raise: "
        "`cpu-specific`), then on each path. Verdicts per input: `pass` (the same exception "
        "type, a subclass, or Dynamo's wrapper of it), `returns-value` (we accept what eager "
        "rejects), `other-error` (another type, or a crash of ours), `dynamo` (compile path: "
        "`torch.compile(backend=\"eager\")` does the same, Dynamo's behaviour). `(pass, other "
        "message)` counts passes whose message misses OpInfo's regex; `construction`: the "
        "module's constructor raises, before any path.",
        "", *rows, "", *timing, *listed, ""]


# Hand-written: the generate() sweep is a script run by hand, not part of make test-full's
# results; kept here so that regenerating this page keeps it.
GENERATE_MODES = [
    "Hugging Face `generate()` (transformers 5.24) beyond greedy, tiny random-init models "
    "(2 layers, d=32: Llama, GPT-2, T5, BART, Whisper), 8 new tokens (`min_new_tokens` = "
    "`max_new_tokens`), tokens compared with eager CPU under the same `torch.manual_seed`. "
    "Modes: greedy; beam search (`num_beams=3`, `num_return_sequences=2`, with and without "
    "`early_stopping`); beam sampling; sampling plain, with `top_k`+`temperature`, `top_p`, "
    "`repetition_penalty` (also greedy), `no_repeat_ngram_size`, `bad_words_ids`; a padded batch "
    "of 2 prompts with `attention_mask` (left padding for Llama/GPT-2, right for T5/BART) greedy, "
    "beam and sampled.",
    "",
    "| path | models x modes | result |",
    "|------|----------------|--------|",
    "| compile (`model.forward = torch.compile(..., backend=\"torchtpu\")`, CPU tensors, "
    "precision `highest`) | all 5 models x all 14 modes | tokens identical to eager, sampling "
    "included; no fallbacks; no exact-shape compiles (no \"compiles once per shape\" warning); "
    "per `generate()` call 3 graphs (prompt, first decode step, dynamic decode step), the "
    "dynamic one in buckets 8 and 16 (decoder-only: `[[16, 8], [16, 16]]`), within "
    "`max_buckets` |",
    "| tpu device, strict | Llama x 12 of the 14 modes (padded-batch beam and sampling not "
    "reached in time); T5 beam did not finish in 3 min | identical tokens where run "
    "(sampling too); slow: a "
    "first greedy run builds each op's program, 200 s, padded batch 390 s on a shared 2-core "
    "machine |",
    "| tpu device, defer-and-fuse | Llama beam, sampling, padded batch greedy; T5 and BART "
    "beam | identical tokens; Whisper beam did not finish in 3 min |",
    "",
    "Not run (time): strict and defer-and-fuse for GPT-2 and Whisper, and for T5/BART beyond "
    "beam search. No failure found, so no transformers limitation to record. Repeatable: "
    "`tests/slow/test_generate_full.py` (`-k beam`: Llama beams and logits processors on a "
    "left-padded batch, T5 and Whisper greedy/beam/sampling, compile path).",
]


#: The unsupported-dtype sweep's verdicts (unsupported.py), as its table's columns.
UNSUPPORTED_COLUMNS = ("returns-value", "other-error", "crashed entries", "dynamo", "pass",
                       "cpu-specific", "unbuildable")


def unsupported_section(runs: dict) -> list:
    """The unsupported-dtype sweep (unsupported.py, ``sweep --unsupported-dtypes``): samples
    per verdict and path for each run (``runs``: label -> {key: result}, e.g. the results
    before a fix and now), then every (entry, dtype) of the last run that returned a value,
    raised another error or crashed (``dynamo`` pairs are Dynamo's: counted only)."""
    from .errors import totals
    rows = ["| run | path | " + " | ".join(UNSUPPORTED_COLUMNS) + " | (entry, dtype) pairs |",
            "|---|---|" + "---|" * (len(UNSUPPORTED_COLUMNS) + 1)]
    for label, results in runs.items():
        counts = totals(list(results.values()))
        for path in sorted(counts):
            pairs = sum(1 for (_, p, _) in results if p == path)
            cells = " | ".join(str(counts[path].get(v, 0)) for v in UNSUPPORTED_COLUMNS)
            rows.append(f"| {label} | {path} | {cells} | {pairs} |")
    last = list(runs.values())[-1] if runs else {}
    listed = ["| entry | dtype | path | status | what it did |", "|---|---|---|---|---|"]
    for (op, path, dtype), r in sorted(last.items()):
        if r["status"] in ("returns-value", "other-error", "fail"):  # dynamo: counted
            listed.append(f"| `{op}` | {dtype} | {path} | {r['status']} | "
                          f"{_short(r['detail'], 120)} |")
    return [
        "OpInfo samples at every dtype of bool, uint8, int8, int16, int32, int64, float16, "
        "bfloat16, float32, float64 and complex64 that `op.supported_dtypes(\"cpu\")` leaves out "
        "(`tests/support/opinfo/unsupported.py`, `sweep --unsupported-dtypes`; first sample "
        "per entry and dtype): eager CPU first, which must raise (where it returns a value, "
        "the dtype is supported after all: `cpu-specific`); `unbuildable`: the sample "
        "function cannot make inputs of that dtype. Verdicts as for error inputs. Path "
        "`inductor` is `torch.compile(backend=\"inductor\")`, for comparison.",
        "", *rows, "", *(listed if len(listed) > 2 else []), ""]


def render(results: dict, seconds: dict, models: dict, dynamic_models: dict | None = None,
           modinfo: dict | None = None, modinfo_seconds: dict | None = None,
           errors: tuple | None = None, unsupported: dict | None = None) -> str:
    """The whole of docs/coverage.md."""
    today = datetime.date.today().isoformat()
    lines = [
        "# Op and model coverage",
        "",
        f"Generated on {today} by `make coverage` (`python -m tests.support.opinfo.report`) from "
        "the results that `make test-full` writes to `build/coverage/`; do not edit by hand.",
        "",
        "OpInfo: every entry of PyTorch's `op_db` (function variant, first 3 samples), run on "
        "each path and compared with eager CPU PyTorch. **compile**: "
        "`torch.compile(backend=\"torchtpu\")` on a function calling the op, matmul precision "
        "`highest`; **eager**: the `tpu` device in strict mode; **fuse**: the `tpu` device in "
        "defer-and-fuse mode (the op recorded, run as one spliced program when its results "
        "come back). A pass means every sample matched *and* ran "
        "through XLA: an entry that matched but had an op run in eager PyTorch (or a Dynamo "
        "graph break) is *falls back*, counted apart, with its cause: `xla-unsupported` "
        "(data-dependent shapes or values, sparse layouts), `ours` (an op we do not lower yet) "
        "or `dynamo` (Dynamo runs the call eagerly whatever the backend). Skips come from "
        "`tests/support/opinfo/skips.py`, each with a category (`xla-unsupported`, `ours`, "
        "`test-artifact`) and reason. Tolerances: fp32 and complex64 (c64) rtol 1e-4, atol 1e-5; "
        "bf16 rtol 5e-2, atol 1e-2 against eager bf16; where eager rounds more, against a wider "
        "reference (fp32 for bf16, fp64 for fp32, complex128 for complex64).",
        "",
        "## Totals",
        "",
        *totals(results),
        "",
    ]
    if seconds:
        lines += ["Sweep time: " + ", ".join(
            f"{os.path.basename(k)} {v / 60:.1f} min" for k, v in seconds.items()), ""]
    if modinfo:
        lines += ["## nn.Module coverage (ModuleInfo)", "",
                  *modinfo_section(modinfo, modinfo_seconds)]
    if errors and (errors[0] or errors[1]):
        lines += ["## Where eager raises (error inputs)", "", *errors_section(*errors)]
    if unsupported:
        lines += ["## Where eager raises (dtypes an op does not support)", "",
                  *unsupported_section(unsupported)]
    if models:
        lines += ["## Model zoo", "", zoo_paragraph(models, zoo_names()), "",
                  *zoo_table(models), ""]
    if dynamic_models:
        lines += ["## Model zoo at many lengths", "", *dynamic_zoo_section(dynamic_models), ""]
    lines += ["## generate() modes", "", *GENERATE_MODES, ""]
    lines += ["## Ops that fall back on the compile path", "", *fallback_summary(results), ""]
    if any(path == "eager" for _, path, _ in results):
        lines += ["## Ops that run on the host on the eager device", "",
                  *fallback_summary(results, path_wanted="eager"), ""]
    lines += [
              "## Every entry", "", "`·`: not run. n/a: the op has no CPU kernel for the dtype.",
              "", *entry_table(results), "",
              "## Reasons (every entry that did not pass, per path and dtype)", "",
              *details(results), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opinfo", nargs="*", help="sweep results (default: "
                        "build/coverage/opinfo*.json)")
    parser.add_argument("--zoo", nargs="*", help="zoo results (default: build/coverage/zoo*.json)")
    parser.add_argument("--out", default="docs/coverage.md")
    args = parser.parse_args(argv)
    opinfo_files = args.opinfo if args.opinfo is not None else \
        sorted(glob.glob("build/coverage/opinfo*.json"), key=os.path.getmtime)
    zoo_files = args.zoo if args.zoo is not None else \
        sorted(glob.glob("build/coverage/zoo*.json"), key=os.path.getmtime)
    if not opinfo_files and not zoo_files:
        print("no results in build/coverage/: run `make test-full` (or python -m "
              "tests.support.opinfo.sweep) first", file=sys.stderr)
        return 2
    results, seconds = load_opinfo(opinfo_files)
    models = load_zoo(zoo_files)
    dynamic_models = load_zoo(sorted(glob.glob("build/coverage/dynamic_zoo*.json"),
                                     key=os.path.getmtime))
    modinfo, modinfo_seconds = load_opinfo(sorted(glob.glob("build/coverage/modinfo*.json"),
                                                  key=os.path.getmtime))
    error_ops, ops_seconds = load_opinfo(sorted(glob.glob("build/coverage/errors-ops*.json"),
                                                key=os.path.getmtime))
    error_modules, modules_seconds = load_opinfo(sorted(
        glob.glob("build/coverage/errors-modules*.json"), key=os.path.getmtime))
    errors = (error_ops, error_modules, {**ops_seconds, **modules_seconds})
    # One run per file: unsupported-dtypes-<label>.json (a run before a fix, say) and
    # unsupported-dtypes.json ("now"), in that order.
    unsupported = {}
    for name in sorted(glob.glob("build/coverage/unsupported-dtypes*.json"),
                       key=lambda n: (n.endswith("unsupported-dtypes.json"), n)):
        label = os.path.basename(name)[len("unsupported-dtypes"):-len(".json")].lstrip("-")
        unsupported[label or "now"] = load_opinfo([name])[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(render(results, seconds, models, dynamic_models, modinfo, modinfo_seconds,
                       errors, unsupported))
    print(f"wrote {args.out}: {len(results)} OpInfo results, {len(models)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())

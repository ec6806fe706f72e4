"""The GPU reports' markdown: the targets table, the training runs with their device and
activation-recomputation plan, each benchmark's section, the steps; ``render`` (REPORT.md) and
``render_first`` (summary.md). No torch."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path


from .report_inputs import (STEP_TITLES, TARGET_DEVICE, TRAIN_RUNS, Inputs, Target, device_of, short_plan, targets,
                            verdict_for)
from .tables import cpu_name, fmt, git_commit, markdown_table, render_rows


# ----------------------------------------------------------------------------- sections


def provenance(inp: Inputs, smoke: bool, budget: float | None, started: float | None) -> list[str]:
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_name()
    except Exception as e:  # a broken install is reported, not raised: the report is still written
        info["torch"] = f"not importable ({type(e).__name__})"
        info["device"] = cpu_name()
    info["device"] = inp.device() or info["device"]
    from importlib import metadata

    versions = []
    for pkg in ("deepspeed", "transformers", "megatron-core", "liger-kernel", "triton"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{pkg} not installed")
    wall = f"{time.time() - started:.0f} s" if started else "n/a"
    lines = ["# GPU report" + (" (CPU smoke run)" if smoke else ""), ""]
    if smoke:
        lines += ["**CPU smoke run at tiny sizes**: every step of the GPU report ran end to end, but the figures are",
                  "CPU figures of shrunken models; the targets below apply to the GPU run only (verdict n/a).", ""]
    lines += [f"* date: {info['date']}", f"* device: {info['device']}", f"* torch: {info['torch']}",
              f"* packages: {', '.join(versions)}", f"* commit: `{info['commit']}`",
              "* command: `bash tools/gpu_report.sh OUT_DIR" + (" --smoke`" if smoke else "`"),
              f"* wall time: {wall} (budget {budget:.0f} s)" if budget else f"* wall time: {wall}",
              f"* training medians leave out the first {inp.skip} step(s) of each run (compilation, warm-up)"]
    return lines


def targets_section(inp: Inputs, smoke: bool) -> list[str]:
    lines = ["", "## Targets", "", f"Every target is for one {TARGET_DEVICE}: a figure measured on another device is "
             "shown with its ratio but not compared (`auto` checkpointing plans differently there).", "",
             "| target | measured | goal | ratio to goal | verdict | device | step | note |",
             "|---|---|---|---|---|---|---|---|"]
    for t in targets(inp):
        device = ""
        if t.measured is None:
            why = inp.why(t.source)
            if t.skipped_part in inp.steps and t.source in inp.steps and inp.steps[t.source].ok:
                why = inp.steps[t.skipped_part].status
            if t.source not in inp.steps and t.source.startswith("train-llama"):
                why = "not run here: tools/gpu_first.sh measures it (its summary.md)"
            measured, ratio, verdict = "not measured", "", why
        else:
            device = device_of(inp, t.source)
            measured = f"{fmt(float(t.measured))} {t.unit}".strip()
            ratio = fmt(t.ratio()) if t.ratio() is not None else ""
            verdict = verdict_for(t.met(), device, smoke)
        lines.append(f"| {t.name} | {measured} | {t.goal} {t.unit} | {ratio} | {verdict} | {device} | {t.source} | "
                     f"{t.note} |")
    return lines


def describe_run(cfg: dict, smoke: bool) -> str:
    """What a training run ran: checkpointing, compile, loss, batch, sequence, ZeRO config, precision."""
    if not cfg:
        return "(no resolved config in the log)"
    m, t = cfg.get("model", {}), cfg.get("train", {})
    device = "CPU" if smoke else "CUDA"
    compile_, loss = m.get("compile"), m.get("loss_implementation")
    if compile_ == "auto":
        compile_ = f"auto ({device}: {'off' if smoke else 'on'})"
    if loss == "auto":
        loss = f"auto ({device}: {'chunked' if smoke else 'fused'})"
    ac = m.get("recompute")
    if ac == "auto":
        budget = m.get("recompute_budget_gib")
        ac = f"auto (budget {budget} GiB)" if budget is not None else "auto (budget: device default)"
    micro, glob = t.get("micro_batch_size"), t.get("global_batch_size")
    accumulation = glob // micro if micro and glob else "?"
    return (f"checkpointing {ac}; compile {compile_}; loss {loss}; micro-batch {micro} x "
            f"{accumulation} accumulation; seq {t.get('seq_length')}; {Path(str(t.get('deepspeed_config'))).name}; "
            f"precision {t.get('precision')}")


def notable_lines(log: str) -> list[str]:
    """The run's own lines about checkpointing plans, compile and the loss: not the config dump, not
    the launcher's (DeepSpeed's timestamped lines echo the command), not warnings."""
    keep = []
    for line in log.splitlines():
        s = line.strip()
        if re.search(r"checkpointing|compil|fused|liger", s, re.I) and not re.match(r'^("?[\w.]+"?\s*:|\[\d{4}-)', s) \
                and "Warning" not in s and len(keep) < 6:
            keep.append(s[:300])
    return keep


def training_section(inp: Inputs, smoke: bool) -> list[str]:
    lines = ["", "## A. Training runs (shipped configs, deepspeed launcher)", "",
             "The shipped `examples/llama_4x5.yaml` / `examples/qwen_4x7.yaml` through `deepspeed --num_gpus 1 "
             "pretrain_loop.py`, data overridden to the generated corpus tokenized with `OUT_DIR/tokenizer` (a "
             "byte-level BPE trained by `tools/train_tokenizer.py --vocab-size 2048` on it; the models keep their "
             "own vocabulary, so the FLOPs are the paper's), global batch = micro-batch x accumulation, each as "
             "shipped and with `--set model.recompute=per_loop`, no final checkpoint. Medians over "
             "the measured steps; each row names its device and the checkpointing plan the run logged.",
             "", "| run | device | checkpointing plan | what ran | tokens/s | MFU % | step s | peak GiB | "
                 "loss first -> last | steps measured (run) | epochs of the corpus |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for sid in TRAIN_RUNS:
        if sid not in inp.steps:
            continue
        s = inp.train(sid)
        ran = describe_run(inp.resolved_config(sid), smoke)
        where = f"{inp.device() or 'unknown'} | {short_plan(inp.plan(sid))}"
        if not s:
            lines.append(f"| {sid} | {where} | {ran} | not measured: {inp.why(sid)} | | | | | | |")
            continue
        lines.append(f"| {sid} | {where} | {ran} | {fmt(s.get('tokens_per_s', ''))} | "
                     f"{fmt(100 * s['mfu']) if 'mfu' in s else ''} | {fmt(s.get('step_time_s', ''))} | "
                     f"{fmt(s.get('mem_peak_gib', ''))} | {fmt(s['loss_first'])} -> {fmt(s['loss_last'])} | "
                     f"{s['steps_measured']} ({s['steps_run']}) | {fmt(s.get('epochs', ''))} |")
        notes += [f"* {sid}: `{line}`" for line in notable_lines(inp.log(sid))]
    lines += ["", "| pair | tokens/s per_loop / as shipped | peak GiB per_loop / as shipped |", "|---|---|---|"]
    for family in ("llama", "qwen"):
        if f"train-{family}" not in inp.steps:
            continue
        a, b = inp.train(f"train-{family}"), inp.train(f"train-{family}-per_loop")
        if a and b:
            lines.append(f"| {family} | {fmt(b['tokens_per_s'] / a['tokens_per_s'])} | "
                         f"{fmt(b['mem_peak_gib'] / a['mem_peak_gib'])} |")
        else:
            lines.append(f"| {family} | not measured | |")
    if notes:
        lines += ["", "What the runs said about checkpointing, compile and the loss:", "", *notes]
    return lines


BENCH_SECTIONS = (
    ("loss", "B. LM head + cross-entropy alone (fused vs chunked, host syncs)",
     "Forward + backward of the head and the loss at micro-batch x 2048 tokens, interleaved; `host_syncs` "
     "counted in one step (CUDA: `torch.cuda.set_sync_debug_mode`; CPU: `measure.host_sync.HostSyncDetector`)."),
    ("peers", "C. Our step vs HF transformers (eager and compiled)",
     "Forward + backward, same widths, effective depth and micro-batch; ratios > 1: ours is faster."),
    ("ckpt", "D. Checkpointing modes at the paper's micro-batch",
     "Forward + backward of Llama 4x5 per mode; `none` runs at the reference micro-batch (the paper's does not "
     "fit without checkpointing), so `time_vs_none` is per token."),
    ("recompute", "R. Recompute cost per loop kind",
     "`recompute_cost`: extra step time per recomputed loop, in forwards of that loop (per_loop should be near "
     "1); selective's figure is what the `auto` planner's cost of a selective loop should be set to."),
    ("profile", "E. Profile of one step (shipped Llama 4x5 model)", "Ops by self time (CUDA kernels on GPU)."),
    ("kept", "F. Targets kept from earlier rounds",
     "Loop vs NonLoop at equal effective depth, graphs compiled when r changes, optimizer share."),
)


def bench_section(inp: Inputs, sid: str, title: str, text: str) -> list[str]:
    lines = ["", f"## {title}", ""]
    data = inp.bench(sid)
    if not data:
        return lines + [f"Not measured: {inp.why(sid)}."]
    p = data["provenance"]
    lines += [text, "", f"`{p['command']}` ({p['dtype']}, seq {p['seq']}, micro-batch {p['micro_batch']}, "
                        f"{p['steps']} steps after {p['warmup']} warm-up)", ""]
    lines += render_rows(data["rows"], every_heading=False)
    return lines


def steps_section(inp: Inputs) -> list[str]:
    lines = ["", "## Steps", "", "| step | what | status | seconds (limit) | command |", "|---|---|---|---|---|"]
    for sid, s in inp.steps.items():
        status = s.status if s.ok or s.status.startswith("skipped") else f"**{inp.why(sid)}**"
        limit = f" ({s.limit_s:.0f})" if s.limit_s else ""
        command = f"`{s.command}`" if s.command else ""
        lines.append(f"| {sid} | {STEP_TITLES.get(sid, '')} | {status} | {s.wall_s:.0f}{limit} | {command} |")
    return lines


def render(inp: Inputs, smoke: bool, budget: float | None = None, started: float | None = None) -> str:
    lines = provenance(inp, smoke, budget, started) + targets_section(inp, smoke) + training_section(inp, smoke)
    for sid, title, text in BENCH_SECTIONS:
        if sid in inp.steps or inp.bench(sid):
            lines += bench_section(inp, sid, title, text)
    lines += steps_section(inp)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- tools/gpu_first.sh: summary.md

# The headline's targets (docs/BENCHMARKS.md): Llama 4x5 through the deepspeed launcher on one H100.
HEADLINE_TARGETS = (("tokens/s", "tokens_per_s", 1.0, ">= 88000", ""), ("MFU", "mfu", 100.0, ">= 50", "%"),
                    ("peak memory", "mem_peak_gib", 1.0, "<= 70", "GiB"))


def run_figures(inp: Inputs, sid: str, smoke: bool, reference: dict | None = None) -> list[str]:
    """One training run of the first session: its figures (medians of the steady steps) against the
    headline targets, the device, the precision and checkpointing-plan lines it logged, what ran."""
    step = inp.steps.get(sid)
    s = inp.train(sid)
    records = [r for r in inp.train_records(sid) if r.get("event") == "train"]
    device = inp.device() or "unknown"
    status = "not run" if step is None else step.status
    if step is not None and not step.ok:
        status = inp.why(sid)
    lines = [f"* status: {status}"]
    if not s:
        return lines + [f"* device: {device}", f"* checkpointing plan: `{inp.plan(sid)}`",
                        f"* precision: `{inp.precision(sid)}`", "", "No training step finished: no figures."]
    measured = (f"steps {s['steps_run'] - s['steps_measured'] + 1}-{s['steps_run']}" if s["steps_measured"] <
                s["steps_run"] else f"all {s['steps_run']} steps (too few to leave the first {inp.skip} out)")
    lines += ["", f"Medians over {measured}; device **{device}**; plan `{short_plan(inp.plan(sid))}`.", "",
              "| figure | value | target (one H100) | ratio to target | verdict |" +
              (" vs headline (same device) |" if reference else ""),
              "|---|---|---|---|---|" + ("---|" if reference else "")]
    for name, key, scale, goal, unit in HEADLINE_TARGETS:
        if key not in s:
            continue
        value = s[key] * scale
        target = Target(name, sid, value, goal, unit)
        vs = ""
        if reference:
            vs = f" {fmt(s[key] / reference[key])} |" if reference.get(key) else " |"
        lines.append(f"| {name} | {fmt(value)} {unit} | {goal} {unit} | {fmt(target.ratio())} | "
                     f"{verdict_for(target.met(), device, smoke)} |{vs}")
    first = records[0].get("step_time_s") if records else None
    extra = [("first step (compile, warm-up)", f"{fmt(first)} s" if first is not None else ""),
             ("step time (median)", f"{fmt(s.get('step_time_s', ''))} s"),
             ("loss first -> last", f"{fmt(s['loss_first'])} -> {fmt(s['loss_last'])}"),
             ("steps measured (run)", f"{s['steps_measured']} ({s['steps_run']})")]
    lines += [f"| {name} | {value} | | | |" + (" |" if reference else "") for name, value in extra]
    return lines + ["", f"* precision: `{inp.precision(sid)}`", f"* checkpointing plan: `{inp.plan(sid)}`",
                    f"* compile: `{inp.log_line(sid, r'^model.compile=') or 'not logged'}`",
                    f"* what ran: {describe_run(inp.resolved_config(sid), smoke)}"]


def kernel_section(inp: Inputs) -> list[str]:
    lines = ["", "## Kernel check: fused vs chunked loss in bf16 against fp32", ""]
    path = inp.out / "kernel.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return lines + [f"Not measured: {inp.why('kernel')}."]
    p = data.get("provenance", {})
    lines += [f"`{p.get('command', '')}` on {p.get('device')} (torch {p.get('torch')}, triton {p.get('triton')}, "
              f"liger-kernel {p.get('liger_kernel')}); tolerances {data.get('tolerances')}: "
              f"**{'PASS' if data.get('pass') else 'FAIL'}**", "",
              "| case | rel loss | rel d hidden | rel d weight | host syncs | verdict |", "|---|---|---|---|---|---|"]
    for r in data.get("rows", []):
        verdict = {True: "pass", False: "**fail**: " + "; ".join(r.get("why", [])), None: "(compared)"}[r.get("pass")]
        lines.append(f"| {r.get('family') or 'V'} {r['vocab']} {r['implementation']} | {fmt(r.get('rel_loss', ''))} | "
                     f"{fmt(r.get('rel_grad_hidden', ''))} | {fmt(r.get('rel_grad_weight', ''))} | "
                     f"{r.get('host_syncs', '')} | {verdict} |")
    return lines


def render_first(inp: Inputs, smoke: bool, budget: float | None = None, started: float | None = None) -> str:
    """summary.md of tools/gpu_first.sh: the headline first, then what else ran."""
    versions = inp.versions()
    wall = f"{time.time() - started:.0f} s" if started else "n/a"
    lines = ["# GPU first session: summary" + (" (CPU smoke run)" if smoke else ""), ""]
    if smoke:
        lines += ["**CPU smoke run at tiny sizes**: every step ran end to end, but the figures are CPU figures of "
                  "shrunken models; the targets apply to the GPU run only (verdict n/a).", ""]
    aborted = inp.logs / "aborted"
    if aborted.exists():
        sid = aborted.read_text().strip()
        lines += [f"**ABORTED at step {sid}**: {inp.why(sid)}", ""]
    lines += [f"* device: {inp.device() or 'unknown (the preamble did not finish)'}",
              f"* packages: {', '.join(f'{k} {v}' for k, v in versions.items()) or 'the preamble did not finish'}",
              f"* commit: `{git_commit()}`", f"* date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
              f"* wall time so far: {wall}" + (f" of a {budget:.0f} s budget" if budget else "")]
    notes = inp.logs / "notes"
    if notes.exists():
        lines += [f"* note: {line}" for line in notes.read_text().splitlines() if line.strip()]
    t = inp.resolved_config("headline").get("train", {})
    batch = (f"micro-batch {t['micro_batch_size']} x {t['global_batch_size'] // t['micro_batch_size']} accumulation"
             if t.get("micro_batch_size") and t.get("global_batch_size") else "micro-batch 38 x 2 accumulation")
    lines += ["", f"## Headline: Llama 4x5 as shipped (deepspeed launcher, {batch})", ""]
    lines += run_figures(inp, "headline", smoke)
    second = next((sid for sid in ("train-per_loop", "train-eager") if sid in inp.steps), None)
    if second:
        what = "recompute=per_loop" if second == "train-per_loop" else "compile=false"
        lines += ["", f"## Second run: the headline with {what} ({second})", ""]
        lines += run_figures(inp, second, smoke, reference=inp.train("headline") or None)
    lines += kernel_section(inp)
    if "loss" in inp.steps:
        lines += bench_section(inp, "loss", "LM head + cross-entropy alone (bench.py --mode loss)",
                               BENCH_SECTIONS[0][2])
    lines += steps_section(inp)
    return "\n".join(lines) + "\n"


def write_report(out: Path, first: bool, smoke: bool, skip: int, logs: Path | None = None,
                 budget: float | None = None, started: float | None = None) -> Path:
    """REPORT.md (the report session) or, with ``first``, summary.md (the first session) into ``out``,
    from what the steps left there (through a temporary file: a reader never sees half a report)."""
    inp = Inputs(out, skip, logs, in_file_order=first)
    path = out / ("summary.md" if first else "REPORT.md")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text((render_first if first else render)(inp, smoke, budget, started))
    tmp.replace(path)
    return path

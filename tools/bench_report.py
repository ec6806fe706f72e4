#!/usr/bin/env python
"""The markdown reports of the GPU scripts: every GPU target's figure, its device and its ratio to the target.

    python tools/bench_report.py OUT_DIR [--smoke] [--skip-steps N]                     # gpu_report.sh: REPORT.md
    python tools/bench_report.py OUT_DIR --first --logs LOGS [--smoke] [--skip-steps N]  # gpu_first.sh: summary.md

Reads what the steps left -- ``steps.tsv`` (per step: id, status, exit code, seconds, limit,
command), each ``tools/bench.py`` step's JSON, each training run's ``metrics.jsonl`` and log, the
device (``device.txt`` beside the logs) -- and writes ``OUT_DIR/REPORT.md`` or, with ``--first``,
``OUT_DIR/summary.md`` (through a temporary file). A step that failed, ran out of time or was
skipped is reported as such, with the last error line of its log. Every training figure is printed
beside the device it came from and the activation-checkpointing plan the run logged (``auto`` plans
differently on an H100 and an H200); the targets are for one H100, so a figure from another device
gets no verdict.

Also what ``tools/bench.py`` and this report share: the summary of a run's ``metrics.jsonl``
(:func:`train_summary`), the markdown table (:func:`markdown_table`) and the provenance helpers.
Nothing here imports torch at module level: the report is written even when a step broke.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- shared with bench.py

# metrics.jsonl fields that are counters or settings, not per-step figures
NOT_FIGURES = ("step", "consumed_samples", "tokens", "lr_muon", "lr_adamw", "skipped_updates", "train_loops")


def train_summary(records: Iterable[dict], skip: int) -> dict:
    """Medians of the figures ``metrics.jsonl`` logs for each training step after the first ``skip``
    (compilation, allocator warm-up; all steps if no more are left), the largest ``mem_peak_gib``
    (the peak of the whole run so far), the first and last loss and how many steps were measured."""
    steps = [r for r in records if r.get("event") == "train"]
    if not steps:
        return {}
    measured = steps[skip:] or steps
    keys = [k for k, v in measured[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in NOT_FIGURES]
    out = {k: statistics.median(r[k] for r in measured if isinstance(r.get(k), (int, float))) for k in keys}
    if "mem_peak_gib" in out:
        out["mem_peak_gib"] = max(r["mem_peak_gib"] for r in steps)
    out.update(loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"], steps_measured=len(measured),
               steps_run=len(steps))
    return out


def fmt(value) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[tuple[str, dict]], keys: Sequence[str] | None = None) -> list[str]:
    """``| case | key ... |`` lines: one row per (case, metrics); columns ``keys`` or every metric the
    rows carry (names starting with ``_`` are raw data, left out)."""
    if keys is None:
        keys = list(dict.fromkeys(k for _, m in rows for k in m if not k.startswith("_")))
    out = ["| case | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for case, m in rows:
        out.append(f"| {case} | " + " | ".join(fmt(m.get(k, "")) for k in keys) + " |")
    return out


def cpu_name() -> str:
    name = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = ""
    if "torch" in sys.modules:
        threads = f", {sys.modules['torch'].get_num_threads()} torch threads"
    return f"{name} ({os.cpu_count()} cores{threads})"


def git_commit() -> str:
    """Short commit of the repository (+dirty), or GPU_REPORT_COMMIT (for a copy without .git)."""
    if os.environ.get("GPU_REPORT_COMMIT"):
        return os.environ["GPU_REPORT_COMMIT"]

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown (no git repository here; set GPU_REPORT_COMMIT)"
    return head + ("+dirty" if git("status", "--porcelain") else "")


# ----------------------------------------------------------------------------- the report's inputs

STEP_TITLES = {
    "data": "generated corpus, BPE tokenizer, indexed dataset",
    "loss": "B. LM head + cross-entropy alone: fused vs chunked",
    "loss-fused": "B. fused (Liger) loss",
    "train-llama": "A1. Llama 4x5 as shipped (deepspeed launcher)",
    "train-llama-per_loop": "A1'. Llama 4x5, activation_checkpointing=per_loop",
    "train-qwen": "A2. Qwen 4x7 as shipped (deepspeed launcher)",
    "train-qwen-per_loop": "A2'. Qwen 4x7, activation_checkpointing=per_loop",
    "ckpt": "D. checkpointing modes at the paper's micro-batch",
    "peers": "C. ours vs HF transformers",
    "peers-compiled": "C. compiled peers",
    "recompute": "R. recompute cost per loop kind",
    "profile": "E. profile of one step",
    "kept": "F. loop vs NonLoop, recompiles across r, Muon share",
    "kept-compile": "F. recompiles across r",
    # tools/gpu_first.sh
    "install": "the kit's wheels into the device's Python path",
    "preamble": "real imports, versions, nvidia-smi, free disk",
    "kernel": "fused vs chunked loss and gradients in bf16 vs fp32",
    "headline": "Llama 4x5 as shipped, micro-batch 38 x 2 (deepspeed launcher)",
    "train-per_loop": "the headline run with activation_checkpointing=per_loop",
    "train-eager": "the headline run with compile=false (the headline failed)",
}
TRAIN_RUNS = ("train-llama", "train-llama-per_loop", "train-qwen", "train-qwen-per_loop")
# where a run's metrics.jsonl is kept when it is not OUT_DIR/runs/ID/metrics.jsonl (tools/gpu_first.sh)
TRAIN_FILES = {"headline": "headline.jsonl", "train-per_loop": "second.jsonl", "train-eager": "second.jsonl"}
# the GPU the targets of docs/BENCHMARKS.md are set for; a figure from another device gets no verdict
TARGET_DEVICE = "H100"


@dataclass
class Step:
    id: str
    status: str
    rc: str
    wall_s: float
    limit_s: float
    command: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def read_steps(out: Path, in_file_order: bool = False) -> dict[str, Step]:
    """The steps of ``steps.tsv`` (the last line of each id), in the report's order or in the file's."""
    steps = {}
    path = out / "steps.tsv"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        fields = line.split("\t")
        if len(fields) != 6:
            continue
        sid, status, rc, wall, limit, command = fields
        steps[sid] = Step(sid, status, rc, float(wall or 0), float(limit or 0), command)
    if in_file_order:
        return steps
    order = {sid: i for i, sid in enumerate(STEP_TITLES)}
    return dict(sorted(steps.items(), key=lambda kv: order.get(kv[0], len(order))))


class Inputs:
    """What the steps left in OUT_DIR, read on demand."""

    def __init__(self, out: Path, skip: int, logs: Path | None = None, in_file_order: bool = False):
        self.out, self.skip = out, skip
        self.logs = logs if logs is not None else out / "logs"
        self.steps = read_steps(out, in_file_order)

    def log(self, sid: str) -> str:
        path = self.logs / f"{sid}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def device(self) -> str | None:
        """The machine the steps ran on (``device.txt`` beside the logs: nvidia-smi's name, or the CPU's)."""
        path = self.logs / "device.txt"
        text = path.read_text().strip() if path.exists() else ""
        return text.splitlines()[0] if text else None

    def log_line(self, sid: str, pattern: str) -> str | None:
        """The first line of step ``sid``'s log that matches ``pattern`` (stripped), or None."""
        for line in self.log(sid).splitlines():
            if re.search(pattern, line):
                return line.strip()
        return None

    def plan(self, sid: str) -> str:
        """The activation-checkpointing plan a training run logged (``auto``), or its fixed mode."""
        line = self.log_line(sid, r"^activation checkpointing auto over ")
        if line:
            return line
        mode = self.resolved_config(sid).get("model", {}).get("activation_checkpointing")
        return f"{mode} (fixed)" if mode else "not logged"

    def precision(self, sid: str) -> str:
        return self.log_line(sid, r"^precision: ") or "not logged"

    def versions(self) -> dict[str, str]:
        """Versions of the packages the preamble imported (``import NAME: ok, version V, ...``)."""
        found = re.findall(r"^import ([\w.]+): ok, version (\S+),", self.log("preamble"), flags=re.M)
        names = {"megatron.core": "megatron-core", "liger_kernel.ops.cross_entropy": "liger-kernel"}
        return {names.get(m, m): v for m, v in found if not m.startswith("megatron_loop")}

    def bench(self, sid: str) -> dict | None:
        """The JSON of a bench.py step (``provenance``, ``rows``), or None."""
        path = self.out / f"{sid}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def rows(self, sid: str) -> list[dict]:
        data = self.bench(sid)
        return data["rows"] if data else []

    def row(self, sid: str, case_pattern: str) -> dict | None:
        """Metrics of the first row of step ``sid`` whose case matches the regular expression."""
        for r in self.rows(sid):
            if re.search(case_pattern, r["case"]):
                return r["metrics"]
        return None

    def train_records(self, sid: str) -> list[dict]:
        path = self.out / "runs" / sid / "metrics.jsonl"
        if not path.exists() and sid in TRAIN_FILES:
            path = self.out / TRAIN_FILES[sid]
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # the last line of a run killed while writing it
                pass
        return records

    def train(self, sid: str) -> dict:
        records = self.train_records(sid)
        if not records:
            return {}
        summary = train_summary(records, self.skip)
        data = next((r for r in records if r.get("event") == "data"), None)
        if summary and data and data.get("train"):
            summary["epochs"] = sum(p.get("epochs", 0) for p in data["train"])
        return summary

    def resolved_config(self, sid: str) -> dict:
        """The config the run resolved (YAML + overrides + defaults), as ``pretrain_loop.py`` prints it."""
        text = self.log(sid)
        at = text.find("resolved config (")
        start = text.find("{", at) if at >= 0 else -1
        if start < 0:
            return {}
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            return {}

    def why(self, sid: str) -> str:
        """Why a step did not give figures: its status and the last error line of its log."""
        step = self.steps.get(sid)
        if step is None:
            return "not run"
        if step.ok:
            return "ran, but left no figures"
        if step.status.startswith("skipped"):
            return step.status
        lines = [ln.strip() for ln in self.log(sid).splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"(error:|\w*(Error|Exception)\b)", ln)]
        last = (errors or lines or ["(empty log)"])[-1]
        return f"{step.status} (exit code {step.rc}, {step.wall_s:.0f} s): {last[:240]}"


# ----------------------------------------------------------------------------- targets


@dataclass
class Target:
    name: str
    source: str  # step id
    measured: float | None
    goal: str  # ">= x", "<= x", "== 0"
    unit: str = ""
    note: str = ""
    skipped_part: str = ""  # the pseudo-step that says why this part was not run (CPU smoke)

    def ratio(self) -> float | None:
        value = float(self.goal.split()[1])
        return None if self.measured is None or value == 0 else self.measured / value

    def met(self) -> bool | None:
        if self.measured is None:
            return None
        op, value = self.goal.split()
        return {">=": self.measured >= float(value), "<=": self.measured <= float(value),
                "==": self.measured == float(value)}[op]


def targets(inp: Inputs) -> list[Target]:
    """The GPU targets of docs/BENCHMARKS.md (speed, MFU, memory, recompiles), each from the step that
    measures it."""
    llama, qwen = inp.train("train-llama"), inp.train("train-qwen")
    peers_compiled = inp.row("peers", r"^ratio .* ours compiled / .* HF compiled")
    peers_eager = inp.row("peers", r"^ratio .* ours eager / .* HF eager")
    ckpt_auto = inp.row("ckpt", r" auto")
    syncs = [m.get("host_syncs") for sid in ("loss", "peers") for r in inp.rows(sid)
             for m in [r["metrics"]] if "host_syncs" in m]
    loop = inp.row("kept", r"^ratio .* \(model\)")
    compiled = inp.row("kept", r" compiled$")
    muon = inp.row("kept", r" muon\+adamw$")

    def get(m: dict | None, key: str, scale: float = 1.0) -> float | None:
        return None if not m or key not in m else m[key] * scale

    peers = peers_compiled or peers_eager
    return [
        Target("Llama 4x5 MFU, deepspeed launcher, as shipped", "train-llama", get(llama, "mfu", 100), ">= 50", "%"),
        Target("Llama 4x5 tokens/s, as shipped", "train-llama", get(llama, "tokens_per_s"), ">= 88000"),
        Target("Qwen 4x7 MFU, deepspeed launcher, as shipped", "train-qwen", get(qwen, "mfu", 100), ">= 45", "%"),
        Target("our step / HF transformers" + (" + torch.compile (both compiled)" if peers_compiled else
                                               " (eager: compiled not run)"),
               "peers", get(peers, "tokens_per_s_ratio"), ">= 1.10", "x",
               "tokens/s ratio of medians; paired and best-step ratios in the peers table"),
        Target("step at the paper's micro-batch (auto) / unconstrained step, per token", "ckpt",
               get(ckpt_auto, "time_vs_none"), "<= 1.08", "x", "none runs at the smaller reference micro-batch"),
        Target("peak memory of the Llama 4x5 run as shipped (parameters, optimizer, activations)", "train-llama",
               get(llama, "mem_peak_gib"), "<= 70", "GiB", "torch.cuda.max_memory_allocated over the run"),
        Target("host syncs per step (our model step; the loss alone: tools/gpu_first.sh)", "peers",
               max(syncs) if syncs else None, "== 0", "", f"largest of {len(syncs)} counted steps"),
        Target("Loop / NonLoop tokens/s (Llama 4x5 / 20x1, model step)", "kept", get(loop, "tokens_per_s_ratio"),
               ">= 0.97", "x"),
        Target("graphs recompiled when r changes", "kept", get(compiled, "new_graphs_other_r"), "== 0",
               skipped_part="kept-compile"),
        Target("Muon+AdamW step share at global batch 1824 x 2048, 8 ranks", "kept",
               get(muon, "fraction_G1824_8ranks", 100), "<= 3", "%"),
    ]


def device_of(inp: Inputs, sid: str) -> str:
    """The device a step's figures came from: its bench JSON's provenance, else the run's device file."""
    data = inp.bench(sid)
    if data and data.get("provenance", {}).get("device"):
        return str(data["provenance"]["device"])
    return inp.device() or "unknown"


def verdict_for(met: bool | None, device: str, smoke: bool) -> str:
    """met / not met, only for a figure from the device the targets are set for (like with like)."""
    if smoke:
        return "n/a (CPU smoke)"
    if TARGET_DEVICE not in device:
        return f"not compared: measured on {device}, the target is for one {TARGET_DEVICE}"
    return "met" if met else "**not met**"


def short_plan(plan: str) -> str:
    """``auto over 5 loops: full x2, selective x2, none x1; predicted peak 61.2 GiB`` from the logged line."""
    m = re.match(r"activation checkpointing (auto over .*?predicted peak [\d.]+ GiB)", plan)
    return m.group(1) if m else plan


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
    ac = m.get("activation_checkpointing")
    if ac == "auto":
        budget = m.get("activation_checkpointing_budget_gib")
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
             "shipped and with `--set model.activation_checkpointing=per_loop`, no final checkpoint. Medians over "
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
    for mode in dict.fromkeys(r["mode"] for r in data["rows"]):
        group = [r for r in data["rows"] if r["mode"] == mode]
        if len({r["mode"] for r in data["rows"]}) > 1:
            lines += [f"### {mode}", ""]
        lines += markdown_table([(r["case"], {k: v for k, v in r["metrics"].items() if k != "host_sync_sites"})
                                 for r in group]) + [""]
        sites = sorted({s for r in group for s in r["metrics"].get("host_sync_sites", [])})
        if sites:
            lines += ["Host sync sites:", "", *[f"* `{s}`" for s in sites[:20]], ""]
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
        what = "activation_checkpointing=per_loop" if second == "train-per_loop" else "compile=false"
        lines += ["", f"## Second run: the headline with {what} ({second})", ""]
        lines += run_figures(inp, second, smoke, reference=inp.train("headline") or None)
    lines += kernel_section(inp)
    if "loss" in inp.steps:
        lines += bench_section(inp, "loss", "LM head + cross-entropy alone (bench.py --mode loss)",
                               BENCH_SECTIONS[0][2])
    lines += steps_section(inp)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="the folder tools/gpu_report.sh wrote")
    ap.add_argument("--smoke", action="store_true", help="a CPU smoke run: figures are not compared to targets")
    ap.add_argument("--skip-steps", type=int, default=3,
                    help="training steps left out of the medians (compilation, warm-up)")
    ap.add_argument("--budget-s", type=float, default=None, help="the run's time budget (for the header)")
    ap.add_argument("--started", type=float, default=None, help="epoch seconds the run started (for the header)")
    ap.add_argument("--first", action="store_true", help="tools/gpu_first.sh's summary.md instead of REPORT.md")
    ap.add_argument("--logs", default=None, help="the folder of the step logs and device.txt (default OUT_DIR/logs)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    if not (out / "steps.tsv").is_file():
        print(f"error: {out}: no steps.tsv; expected the folder tools/gpu_report.sh wrote", file=sys.stderr)
        return 2
    if args.skip_steps < 0:
        print(f"error: --skip-steps {args.skip_steps}: expected 0 or more", file=sys.stderr)
        return 2
    inp = Inputs(out, args.skip_steps, Path(args.logs) if args.logs else None, in_file_order=args.first)
    name = "summary.md" if args.first else "REPORT.md"
    text = (render_first if args.first else render)(inp, args.smoke, args.budget_s, args.started)
    tmp = out / f"{name}.tmp"
    tmp.write_text(text)
    tmp.replace(out / name)
    print(f"report written to {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

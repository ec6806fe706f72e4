"""The GPU reports' inputs (tools/gpu_report.sh's REPORT.md, tools/gpu_first.sh's summary.md): what the
steps left in the output folder, and the targets each figure is compared with. No torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


from .tables import train_summary



STEP_TITLES = {
    "data": "generated corpus, BPE tokenizer, indexed dataset",
    "loss": "B. LM head + cross-entropy alone: fused vs chunked",
    "loss-fused": "B. fused (Liger) loss",
    "train-llama": "A1. Llama 4x5 as shipped (deepspeed launcher)",
    "train-llama-per_loop": "A1'. Llama 4x5, recompute=per_loop",
    "train-qwen": "A2. Qwen 4x7 as shipped (deepspeed launcher)",
    "train-qwen-per_loop": "A2'. Qwen 4x7, recompute=per_loop",
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
    "train-per_loop": "the headline run with recompute=per_loop",
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
        """The activation-recomputation plan a training run logged (``auto``), or its fixed mode."""
        line = self.log_line(sid, r"^activation (?:recomputation|checkpointing) auto over ")  # and runs before the rename
        if line:
            return line
        mode = self.resolved_config(sid).get("model", {}).get("recompute")
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
        """The config the run resolved (YAML + overrides + defaults): the file its log names
        (``resolved config: PATH (...)``, training/banner.py), or, in logs of older runs, the JSON
        printed after ``resolved config (``."""
        text = self.log(sid)
        named = re.search(r"^resolved config: (.+?) \(", text, re.MULTILINE)
        if named:
            try:
                return json.loads(Path(named.group(1)).read_text())
            except (OSError, ValueError):
                return {}
        at = text.find("resolved config (")
        start = text.find("{", at) if at >= 0 else -1
        if start < 0:
            return {}
        try:
            resolved = json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            return {}
        from megatron_loop.config.loading import RENAMED_KEYS  # a run before a key's rename logged its old name

        model = resolved.get("model") or {}
        for old, new in RENAMED_KEYS.items():
            if old.startswith("model.") and old[len("model."):] in model:
                model.setdefault(new, model.pop(old[len("model."):]))
        return resolved

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
    m = re.match(r"activation (?:recomputation|checkpointing) (auto over .*?predicted peak [\d.]+ GiB)", plan)
    return m.group(1) if m else plan

"""What a run prints and writes: a markdown table per mode, and the provenance of the figures
(command, date, commit, device, sizes, MFU peak) in the printed header and the ``--json`` file."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import torch

from megatron_loop.atomic import write_atomic
from megatron_loop.gpu.tables import cpu_name, git_commit, render_rows

from .harness import Row, Setup


def render(rows: list[Row]) -> str:
    """A markdown table per mode: case, then every metric the mode's rows carry (the GPU reports' renderer)."""
    return "\n".join(["", *render_rows([asdict(r) for r in rows])])


def provenance(setup: Setup, argv: list[str]) -> dict:
    device = torch.cuda.get_device_name(setup.device) if setup.cuda else cpu_name()
    return {"command": "python tools/bench.py " + " ".join(argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": git_commit(),
            "device": device, "torch": torch.__version__, "dtype": str(setup.dtype).replace("torch.", ""),
            "seq": setup.seq, "micro_batch": setup.micro_batch, "steps": setup.steps, "warmup": setup.warmup,
            "compile": setup.compile, "engine": setup.engine, "peak_flops": setup.peak_flops,
            "peak": setup.peak_label}


def report(setup: Setup, argv: list[str], rows: list[Row], json_path: str | None) -> None:
    """Print the header line and the tables; write every figure and its provenance to ``json_path``."""
    info = provenance(setup, argv)
    print(f"device {info['device']} | {info['dtype']} | seq {setup.seq} | micro-batch {setup.micro_batch} | "
          f"steps {setup.steps} (+{setup.warmup} warm-up) | commit {info['commit']} | {info['date']} | "
          f"MFU peak: {setup.peak_label}")
    print(render(rows))
    if json_path:
        write_atomic(json_path, json.dumps({"provenance": info, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")

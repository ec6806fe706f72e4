"""Load HF exports in a fresh process and compare their logits with saved reference logits.

    HF_HUB_OFFLINE=1 python check_hf_logits.py CASES.json

``CASES.json`` maps a name to ``{"path": HF_DIR, "native": bool, "reference": FILE.pt, "kwargs": {...}}``
where the ``.pt`` holds ``{"input_ids": LongTensor, "logits": {r: FloatTensor}}``. LoopLM
exports load with ``trust_remote_code=True`` and ``num_loops=r`` (and the case's ``kwargs``, e.g. ``timestep_grid``) as from_pretrained kwargs;
native exports load without remote code. Prints one JSON object: per name the loaded class,
the config's model_type and per r the relative error max|a - b| / max|b|.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    report = {}
    for name, case in cases.items():
        ref = torch.load(case["reference"])
        errors = {}
        for r, expected in ref["logits"].items():
            kwargs = {} if case["native"] else {"trust_remote_code": True, "num_loops": int(r), **case.get("kwargs", {})}
            model = AutoModelForCausalLM.from_pretrained(case["path"], **kwargs).eval()
            with torch.no_grad():
                logits = model(ref["input_ids"]).logits
            errors[str(r)] = ((logits - expected).abs().max() / expected.abs().max()).item()
        report[name] = {"class": type(model).__name__, "model_type": model.config.model_type,
                        "timestep_grid": getattr(model.config, "timestep_grid", None),
                        "dtype": str(model.dtype), "rel_error": errors}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""A registered study's report, from its archive alone: the registered outcome first (the primary test's
parts, the verdict), then the secondary readings the plan named (intervals, no decision), the trivial
baselines of the compose items next to the models' scores, the curves over r, and provenance (commits,
times, wall time). docs/REPRODUCE.md's study sections are this text (``tools/study.py docs``).
"""

from __future__ import annotations

import math

import numpy as np

from megatron_loop.studies import analysis as A
from megatron_loop.studies.archive import compose_docs, runs_of
from megatron_loop.studies.baselines import baselines
from megatron_loop.studies.plan import Measure, StudyPlan
from megatron_loop.studies.post_hoc import POST_HOC

CURVE_MEASURES = {
    "compose in-horizon acc": Measure("compose", "accuracy", split="in_horizon"),
    "compose beyond acc": Measure("compose", "accuracy", split="beyond"),
    "compose seen acc": Measure("compose", "accuracy", split="seen"),
    "facts acc": Measure("facts", "accuracy"),
    "facts margin": Measure("facts", "margin"),
    "openbook acc": Measure("openbook", "accuracy"),
    "openbook margin": Measure("openbook", "margin"),
    "held-out loss": Measure("heldout", "loss"),
}


def _num(x: float, digits: int) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{digits}f}"


def _stat_cells(stat: dict | None, digits: int) -> list[str]:
    if stat is None:
        return ["0", "—", "—", "—"]
    return [str(stat["n"]), _num(stat["mean"], digits), f"[{_num(stat['lo'], digits)}, {_num(stat['hi'], digits)}]",
            f"{_num(stat['lower'], digits)} / {_num(stat['upper'], digits)}"]


def _digits(label: str) -> int:
    return 1 if "points" in label else 3


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds / 3600:.2f} h ({seconds / 60:.0f} min)"


def summary(plan: StudyPlan, document: dict) -> dict:
    """Everything the report states, computed from the archive (also what the re-analysis test compares)."""
    runs = runs_of(document)
    out = A.analyse(plan, runs)
    out["curves"] = A.curves(plan, runs, {k: m for k, m in CURVE_MEASURES.items()
                                          if m.task == "heldout" or m.task in document["items"]})
    docs = compose_docs(document)
    out["baselines"] = baselines([d for d in docs if d["split"] != "seen"])["by_depth"] if docs else {}
    out["provenance"] = document["provenance"]
    walls = [r["wall_s"] for r in document["runs"] if r.get("wall_s")]
    out["run_wall_s"] = {"median": float(np.median(walls)), "min": min(walls), "max": max(walls)} if walls else None
    return out


def markdown(plan: StudyPlan, document: dict) -> str:
    s = summary(plan, document)
    prov = s["provenance"]
    lines = [f"**Registered outcome: {s['verdict']}.**", ""]
    lines += ["| part of the primary test | seeds | mean | 95 % t interval | one-sided 95 % bounds (lower / upper) | "
              "smallest effect of interest | decision |", "|---|---|---|---|---|---|---|"]
    for part in s["primary"]:
        d = _digits(part["label"])
        sign = "> 0" if part["direction"] > 0 else "< 0"
        lines.append(f"| {part['name']}: {part['label']} {sign} | " + " | ".join(_stat_cells(part["stat"], d))
                     + f" | {part['sesoi']:g} | {part['decision']} |")
    seeds = sorted({seed for part in s["primary"] if part["stat"] for seed in part["stat"]["per_seed"]}, key=int)
    if seeds:
        lines += ["", "Per seed, the primary test's values:", "",
                  "| seed | " + " | ".join(part["name"] for part in s["primary"]) + " |",
                  "|---|" + "---|" * len(s["primary"])]
        for seed in seeds:
            cells = [_num((part["stat"] or {}).get("per_seed", {}).get(seed), _digits(part["label"])) for part in s["primary"]]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    if s["missing_runs"]:
        lines += ["", "Runs missing from the archive: " + ", ".join(f"`{m}`" for m in s["missing_runs"]) + "."]
    where = ("**A smoke run (a pipeline check at toy size), not a confirmatory run.** " if prov.get("smoke") else
             f"Ran from commit `{prov['commit'][:12]}` (clean checkout), plan sha256 `{prov['plan_sha256'][:12]}` "
             f"registered in commit `{prov['registration_commit'][:12]}` at {prov['registered_at']}; ")
    lines += ["", where + f"started {prov['started_utc']}, finished {prov.get('finished_utc', '—')}: wall time "
              f"{_hours(prov.get('wall_s'))} on the shared 2-core CPU machine, two runs at a time"
              + (f" (one run's train + export + sweep: median {s['run_wall_s']['median'] / 60:.1f} min)"
                 if s["run_wall_s"] else "") + ".", "",
              "Secondary readings named in the plan (t intervals over seeds; no decision attached):", "",
              "| reading | seeds | mean | 95 % t interval | one-sided 95 % bounds |", "|---|---|---|---|---|"]
    for row in s["secondary"]:
        d = _digits(row["what"])
        lines.append(f"| {row['label']}: {row['what']} | " + " | ".join(_stat_cells(row["stat"], d)) + " |")
    if s["baselines"]:
        lines += ["", "Trivial baselines of the compose items that are not seen in training (percent correct on the "
                  "same items; each rule's best variant chosen on these items), against the models' mean accuracy "
                  "at r = K:", "",
                  "| depth | split | items | most common answer | start digit | last m moves | first m moves | best |"
                  + "".join(f" `{a.name}` at K |" for a in plan.arms), "|---|---|---|---|---|---|---|---|"
                  + "---|" * len(plan.arms)]
        for depth, b in s["baselines"].items():
            split = "beyond" if int(depth) > 4 else "in_horizon"
            model = []
            for arm in plan.arms:
                c = s["curves"].get(arm.name)
                if c is None:
                    model.append("—")
                    continue
                runs = runs_of(document)[arm.name]
                k = arm.toy.layout[2]
                vals = [A.value(items, Measure("compose", "accuracy", depths=(int(depth),)), k) for items in runs.values()]
                model.append(f"{np.mean(vals):.1f}")
            lines.append(f"| {depth} | {split} | {b['n']} | {b['most_common']:.1f} | {b['start_digit']:.1f} | "
                         f"{b['last_m_moves']:.1f} | {b['first_m_moves']:.1f} | {b['best']:.1f} | " + " | ".join(model) + " |")
    post_hoc = A.post_hoc(plan, runs_of(document), POST_HOC.get(plan.name, ()))
    if post_hoc:
        lines += ["", "**Post hoc readings: chosen after the data were seen; they decide nothing** "
                  "(megatron_loop/studies/post_hoc.py says when and why each was added):", "",
                  "| reading | why | seeds | mean | 95 % t interval |", "|---|---|---|---|---|"]
        for row in post_hoc:
            cells = _stat_cells(row["stat"], _digits(row["what"]))[:3]
            lines.append(f"| {row['label']}: {row['what']} | {row['why']} | " + " | ".join(cells) + " |")
    for arm in plan.arms:
        c = s["curves"].get(arm.name)
        if c is None:
            continue
        lines += ["", f"`{arm.name}` ({arm.layout_text}, K = {c['K']}) over r, mean over {len(s['seeds'][arm.name])} seeds:",
                  "", "| r | " + " | ".join(map(str, c["loops"])) + " |", "|---|" + "---|" * len(c["loops"])]
        for key in CURVE_MEASURES:
            if key in c:
                digits = 3 if ("margin" in key or "loss" in key) else 1
                lines.append(f"| {key} | " + " | ".join(f"{v:.{digits}f}" for v in c[key]["mean"]) + " |")
    return "\n".join(lines)

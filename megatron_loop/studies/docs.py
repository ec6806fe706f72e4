"""The study sections of docs/REPRODUCE.md and the studies table of README.md, generated from the plans, the
pilot summaries (``docs/studies/pilots/*.json``) and the archives (``docs/studies/STUDY.json.gz``):
``tools/study.py docs`` writes them, ``--check`` (and tests/unit/studies/test_reanalysis.py) fails when the
committed text differs from what the archives give. Each section sits between ``<!-- study:NAME:begin -->``
and ``<!-- study:NAME:end -->``; the README table between ``<!-- studies:begin -->`` and ``<!-- studies:end -->``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from megatron_loop.atomic import write_atomic
from megatron_loop.errors import LoopDataError
from megatron_loop.studies import archive
from megatron_loop.studies.plan import StudyPlan
from megatron_loop.studies.plans import PLANS
from megatron_loop.studies.registration import REGISTERED

PILOTS_DIR = archive.ARCHIVE_DIR / "pilots"
REPRODUCE, README = Path("docs/REPRODUCE.md"), Path("README.md")


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- {key}:begin -->", f"<!-- {key}:end -->"


def replace_block(text: str, key: str, body: str, path: Path) -> str:
    begin, end = _markers(key)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise LoopDataError(f"{path}: no {begin} ... {end} block; expected the markers the study docs go between")
    return pattern.sub(lambda _: f"{begin}\n{body.rstrip()}\n{end}", text, count=1)


def pilot_table(root: Path) -> str:
    """Every committed pilot summary: model, corpus, scores at r = K against the best trivial baseline."""
    rows = []
    for path in sorted((root / PILOTS_DIR).glob("*.json")):
        p = json.loads(path.read_text())
        at = p["loops"].index(p["K"])
        compose = p["tasks"].get("compose", {})
        cells = []
        for key in ("in_horizon/2", "in_horizon/3", "in_horizon/4", "beyond/5", "beyond/6"):
            row = compose.get("by_split_depth", {}).get(key)
            base = compose.get("baselines", {}).get(key.split("/")[1], {})
            cells.append("—" if row is None else f"{row['accuracy'][at]:.1f} ({base.get('best', float('nan')):.1f})")
        facts, book = p["tasks"].get("facts", {}), p["tasks"].get("openbook", {})
        spec = p.get("corpus_spec", {})
        corpus = (f"{spec.get('compose_moves', '?')} moves, {spec.get('held_out_contexts', '?')} held out, "
                  f"{spec.get('knowledge_mentions', '?')} mentions") if spec else "—"
        rows.append(f"| `{path.stem}` | {p['layout']} | {corpus} | " + " | ".join(cells)
                    + f" | {facts['accuracy'][at]:.1f} / {facts['margin'][at]:+.2f}" if facts else "—")
        rows[-1] += (f" | {book['accuracy'][at]:.1f} / {book['margin'][at]:+.2f}" if book else " | —") + \
            f" | {p.get('note', '')} |"
    head = ["| pilot | layout | corpus | in-horizon 2 | in-horizon 3 | in-horizon 4 | beyond 5 | beyond 6 | "
            "facts acc / margin | openbook acc / margin | what it was for |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows) if rows else "No pilot summaries committed."


def study_section(root: Path, plan: StudyPlan) -> str:
    from megatron_loop.studies.report import markdown

    path = archive.archive_path(root, plan.name)
    lines = [f"Command: `bash tools/small_study.sh {plan.name}` (re-analysis from the archive: "
             f"`python tools/study.py analyse {plan.name}`).", ""]
    if path.is_file():
        lines += [markdown(plan, archive.read(path)), ""]
    else:
        lines += ["Not run yet: no archive `docs/studies/" + plan.name + ".json.gz`.", ""]
    status = f"registered, sha256 `{REGISTERED[plan.name][:12]}`" if plan.name in REGISTERED else "not registered"
    lines += [f"The plan ({status}; `python tools/study.py plan {plan.name}`):", "", "```text", plan.text(), "```"]
    return "\n".join(lines)


def readme_table(root: Path) -> str:
    from megatron_loop.studies.report import summary

    lines = ["| study | command | verdict (registered test) | primary statistic: mean [95 % t interval], seeds | "
             "wall time |", "|---|---|---|---|---|"]
    for plan in PLANS.values():
        path = archive.archive_path(root, plan.name)
        if not path.is_file():
            lines.append(f"| `{plan.name}` | `bash tools/small_study.sh {plan.name}` | not run | — | — |")
            continue
        s = summary(plan, archive.read(path))
        stats = "; ".join(f"{p['name']}: {p['stat']['mean']:+.2f} [{p['stat']['lo']:+.2f}, {p['stat']['hi']:+.2f}], "
                          f"n = {p['stat']['n']}" if p["stat"] else f"{p['name']}: —" for p in s["primary"])
        wall = s["provenance"].get("wall_s")
        lines.append(f"| `{plan.name}` | `bash tools/small_study.sh {plan.name}` | {s['verdict']} | {stats} | "
                     + (f"{wall / 3600:.2f} h |" if wall else "— |"))
    return "\n".join(lines)


def write_docs(root: Path, check: bool = False) -> list[Path]:
    """Regenerate the blocks; returns the files whose text changed (with ``check``: would change)."""
    changed = []
    targets = {root / REPRODUCE: [("study_pilots", lambda: pilot_table(root))]
               + [(f"study:{p.name}", (lambda plan=p: study_section(root, plan))) for p in PLANS.values()],
               root / README: [("studies", lambda: readme_table(root))]}
    for path, blocks in targets.items():
        text = path.read_text()
        new = text
        for key, body in blocks:
            new = replace_block(new, key, body(), path)
        if new != text:
            changed.append(path)
            if not check:
                write_atomic(path, new)
    return changed

#!/usr/bin/env python
"""Registered studies (docs/STUDIES.md, ``megatron_loop/studies/``): plans, the gate before a confirmatory run,
the archive after it, the re-analysis from the archive, the docs generated from it, pilot summaries.

    python tools/study.py list                                   # the registered studies, runs x seeds
    python tools/study.py plan finding1_r2                       # the plan as registered, with its sha256
    python tools/study.py gate finding1_r2 --run RUN             # refuses a changed plan / a dirty checkout
    python tools/study.py finish finding1_r2 --run RUN           # archive + analysis (docs/studies/STUDY.json.gz)
    python tools/study.py analyse finding1_r2                    # re-analyse from the archive (tables)
    python tools/study.py docs [--check]                         # the study sections of REPRODUCE.md / README
    python tools/study.py pilot --items RUN/NAME/paired/items.json --corpus RUN/corpus --output OUT.json

``bash tools/small_study.sh STUDY`` runs gate, the runs and finish in order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from megatron_loop.cli import run_cli
from megatron_loop.errors import LoopConfigError

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: Sequence[str] | None) -> int:
    from megatron_loop import studies

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the registered studies: models x seeds = runs")
    p = sub.add_parser("plan", help="print a study's plan and its sha256")
    p.add_argument("study")
    g = sub.add_parser("gate", help="check the plan and the checkout, write RUN/provenance.json")
    g.add_argument("study")
    g.add_argument("--run", required=True)
    g.add_argument("--smoke", action="store_true",
                   help="a pipeline check, not a confirmatory run: nothing refused, provenance marked smoke, the "
                        "archive kept in RUN (tools/small_study.sh with STUDY_SMOKE=1; the tests)")
    f = sub.add_parser("finish", help="archive every run's items and analyse the archive")
    f.add_argument("study")
    f.add_argument("--run", required=True)
    f.add_argument("--archive", default=None, help="archive path (default docs/studies/STUDY.json.gz here)")
    a = sub.add_parser("analyse", help="the study's analysis from its archive, as markdown")
    a.add_argument("study")
    a.add_argument("--archive", default=None)
    d = sub.add_parser("docs", help="write (or --check) the study sections of docs/REPRODUCE.md and README.md")
    d.add_argument("--check", action="store_true")
    pi = sub.add_parser("pilot", help="summarise one pilot run (small JSON, committed whatever it shows)")
    pi.add_argument("--items", required=True)
    pi.add_argument("--corpus", required=True, help="the pilot's corpus folder (tools/make_corpus.py output)")
    pi.add_argument("--label", default="")
    pi.add_argument("--note", default="", help="what the pilot was for")
    pi.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    if args.command == "list":
        for plan in studies.PLANS.values():
            seeds = ", ".join(f"{arm.name} {len(arm.seeds)}" for arm in plan.arms)
            print(f"{plan.name}\t{sum(len(arm.seeds) for arm in plan.arms)} runs (seeds: {seeds})\t{plan.title}")
        return 0
    if args.command == "pilot":
        return _pilot(args)
    if args.command == "docs":
        from megatron_loop.studies import docs

        changed = docs.write_docs(ROOT, check=args.check)
        if args.check and changed:
            for path in changed:
                print(f"error: {path}: its study sections differ from the archives; run python tools/study.py docs",
                      file=sys.stderr)
            return 1
        print("\n".join(f"wrote {p}" for p in changed) or "docs up to date")
        return 0
    plan = studies.plan_of(args.study)
    if args.command == "plan":
        print(plan.text())
        print(f"\nsha256 {plan.sha256()}; registered {studies.REGISTERED.get(plan.name, 'no')}")
        return 0
    from megatron_loop.studies import archive, provenance

    if args.command == "gate":
        run = Path(args.run)
        if args.smoke:
            record = provenance.smoke_record(plan, ROOT)
            run.mkdir(parents=True, exist_ok=True)
            print(f"study {plan.name}: smoke run (not confirmatory): nothing checked; wrote "
                  f"{provenance.write_provenance(run, record)}")
            return 0
        record = provenance.gate(plan, studies.REGISTERED, ROOT)
        previous = run / provenance.PROVENANCE_FILE
        if previous.is_file():  # a resumed study: the same commit and plan, the first start kept
            old = json.loads(previous.read_text())
            if (old.get("commit"), old.get("plan_sha256"), old.get("smoke")) != (record["commit"], record["plan_sha256"], None):
                raise LoopConfigError(f"{previous}: this run folder was started from commit {str(old.get('commit'))[:12]}"
                                      f"{' as a smoke run' if old.get('smoke') else ''}; expected a resume from the same "
                                      f"commit ({record['commit'][:12]}) or a new STUDY_RUN")
            print(f"study {plan.name}: resuming the run started {old['started_utc']} from {record['commit'][:12]}")
            return 0
        run.mkdir(parents=True, exist_ok=True)
        print(f"study {plan.name}: plan {record['plan_sha256'][:12]} registered in {record['registration_commit'][:12]} "
              f"({record['registered_at']}); running from {record['commit'][:12]}, clean checkout")
        print(f"wrote {provenance.write_provenance(run, record)}")
        return 0
    if args.command == "finish":
        run = Path(args.run)
        record = json.loads((run / provenance.PROVENANCE_FILE).read_text()) if (run / provenance.PROVENANCE_FILE).is_file() else None
        if record is None:
            raise LoopConfigError(f"{run / provenance.PROVENANCE_FILE}: missing; expected tools/study.py gate first")
        if "finished_utc" not in record:
            started = time.mktime(time.strptime(record["started_utc"], "%Y-%m-%dT%H:%M:%SZ"))
            record["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record["wall_s"] = round(time.mktime(time.strptime(record["finished_utc"], "%Y-%m-%dT%H:%M:%SZ")) - started)
            provenance.write_provenance(run, record)
        default = run / f"{plan.name}.json.gz" if record.get("smoke") else archive.archive_path(ROOT, plan.name)
        path = Path(args.archive) if args.archive else default
        archive.write(archive.collect(plan, run, run / "corpus" / "eval"), path)
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
        print(studies.report_of(plan, archive.read(path)))
        return 0
    if args.command == "analyse":
        path = Path(args.archive) if args.archive else archive.archive_path(ROOT, plan.name)
        print(studies.report_of(plan, archive.read(path)))
        return 0
    raise AssertionError(args.command)


def _pilot(args) -> int:
    from megatron_loop.atomic import write_atomic
    from megatron_loop.eval.paired import read_docs
    from megatron_loop.studies.pilots import summarise

    if not Path(args.items).is_file():
        raise LoopConfigError(f"--items {args.items}: missing; expected a run's paired/items.json")
    items = json.loads(Path(args.items).read_text())
    corpus = Path(args.corpus)
    compose = corpus / "eval" / "compose.jsonl"
    summary = summarise(items, read_docs(compose) if compose.is_file() else None, args.label)
    manifest = corpus / "manifest.json"
    if manifest.is_file():
        summary["corpus_spec"] = json.loads(manifest.read_text())["spec"]
    summary["note"] = args.note
    write_atomic(Path(args.output), json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())

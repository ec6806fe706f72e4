#!/usr/bin/env python
"""Generate the bundled corpus: template prose plus depth-controlled reasoning (CLUTRR-,
ProofWriter- and BBH tracking-style), with held-out lm-eval tasks. Nothing is downloaded.

    python tools/make_corpus.py --output-dir runs/corpus --seed 0
    python tools/eval_loops.py ... --include-path runs/corpus/eval --tasks clutrr=looplm_clutrr_local
    lm_eval ... --include_path runs/corpus/eval --tasks looplm_clutrr_local

The task YAMLs name their items by absolute path (lm_eval resolves data_files against the working
directory); a copied or moved corpus still reads its own items through tools/eval_loops.py, which
reads the file of that name beside the YAML and says so (plain lm_eval reads what the YAML names).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from megatron_loop.cli import check_output_folder, run_cli
from megatron_loop.data.corpus import GENERATORS, KNOWLEDGE_EVAL, CorpusSpec, generate_corpus


def main(argv: Sequence[str] | None = None) -> int:
    d = CorpusSpec()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--prose-docs", type=int, default=d.prose_docs)
    ap.add_argument("--reasoning-docs-per-task", type=int, default=d.reasoning_docs_per_task)
    ap.add_argument("--valid-docs", type=int, default=d.valid_docs)
    ap.add_argument("--eval-items-per-depth", type=int, default=d.eval_items_per_depth)
    ap.add_argument("--train-max-depth", type=int, default=d.train_max_depth)
    ap.add_argument("--eval-max-depth", type=int, default=d.eval_max_depth)
    ap.add_argument("--eval-min-depth", type=int, default=d.eval_min_depth,
                    help="shallowest depth of the held-out reasoning items")
    ap.add_argument("--follow-up-questions", type=int, default=d.follow_up_questions,
                    help="further questions about the same context in each reasoning training document")
    ap.add_argument("--knowledge-people", type=int, default=d.knowledge_people,
                    help="people of the knowledge task (facts stated in training biographies)")
    ap.add_argument("--knowledge-mentions", type=int, default=d.knowledge_mentions,
                    help="training biographies per person")
    ap.add_argument("--knowledge-qa-fraction", type=float, default=d.knowledge_qa_fraction,
                    help="share of the people whose Q&A is also in train (the others' are the held-out items)")
    ap.add_argument("--reasoning-tasks", default=",".join(d.reasoning_tasks),
                    help=f"comma-separated reasoning generators among {','.join(GENERATORS)}")
    ap.add_argument("--knowledge-eval", choices=KNOWLEDGE_EVAL, default=d.knowledge_eval,
                    help="heldout: ask about the people without Q&A in train; trained: ask the trained "
                         "Q&A (recall of stored facts)")
    ap.add_argument("--knowledge-qa-mentions", type=int, default=d.knowledge_qa_mentions,
                    help="copies of each Q&A person's question-answer document in train")
    ap.add_argument("--compose-moves", type=int, default=d.compose_moves,
                    help="move permutations of the compose task (10 x moves^h contexts at depth h)")
    ap.add_argument("--held-out-contexts", type=int, default=d.held_out_contexts,
                    help="compose contexts per trained depth 2..train-max-depth kept out of training: that "
                         "depth's eval items")
    ap.add_argument("--control-docs", type=int, default=d.control_docs,
                    help="training documents of the in-context control of the facts (openbook)")
    ap.add_argument("--control-items", type=int, default=d.control_items,
                    help="eval items of the in-context control (fresh people, names outside training)")
    a = ap.parse_args(argv)
    a.reasoning_tasks = tuple(t for t in a.reasoning_tasks.split(",") if t)
    check_output_folder(a.output_dir, "--output-dir", "the corpus files")
    spec = CorpusSpec(**{k: v for k, v in vars(a).items() if k != "output_dir"})
    print(json.dumps(generate_corpus(a.output_dir, spec)))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

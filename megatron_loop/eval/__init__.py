"""Loop-sweep evaluation of exported LoopLMs (paper Sec. 2.3, App. C.3).

* ``tasks``   -- the task table: groups, headline metric per task, aggregation;
* ``harness`` -- one lm-evaluation-harness pass at one r (+ accuracy per depth);
* ``heldout`` -- held-out loss / perplexity on an indexed validation prefix;
* ``sweep``   -- load once, run every r;
* ``report``  -- results.json, results.csv, per_depth.csv and the task x r console table;
* ``plots``   -- Fig. 2 / Fig. 1 b,c style PNGs and loss vs r;
* ``cli``     -- the command line of ``tools/eval_loops.py``: settings, resume, the sweep, the outputs.
The shipped lm-eval YAMLs (ProofWriter, CLUTRR, 14 BBH subtasks) live in ``eval/tasks/``.
"""

from megatron_loop.eval.tasks import BBH_SUBTASKS, PAPER_TASKS, TaskSpec, aggregate, resolve_tasks

__all__ = ["BBH_SUBTASKS", "PAPER_TASKS", "TaskSpec", "aggregate", "resolve_tasks"]

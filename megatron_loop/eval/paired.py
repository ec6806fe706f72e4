"""Paired, item-level loop sweeps: the data of the paper's first finding as the paper measures it
(Sec. 3, Fig. 1(a), Tables 8-9): one trained model, weights fixed, every item's outcome at every r.

Scoring (:func:`score_docs`) is lm-evaluation-harness's zero-shot multiple choice, done here on
the exported model directly so that every item's outcome at every r is kept (lm-eval's sweep
keeps only the means): each choice is the continuation ``" " + choice`` of the item's query, split
into tokens as lm-eval's ``_encode_pair`` does (the whole string encoded, the context's tokens cut
off), scored by its summed log-likelihood; ``acc`` takes the argmax, ``acc_norm`` the argmax of
log-likelihood / len(choice) in characters (lm-eval's). Which metric a task uses is its
:class:`~megatron_loop.eval.tasks.TaskSpec` in ``eval/tasks.py`` (compose: acc, facts: acc_norm),
the one place metrics are defined. The same items run through lm-eval with
``tools/eval_loops.py --include-path CORPUS/eval --tasks facts,compose`` give the same means.

The sweep (:func:`sweep_items`) writes ``items.json``: per task, per r, the 0/1 outcome of every
item in the task file's order, with the items' depths (hops), plus the held-out loss per r. The
paired statistics are ``eval/paired_stats.py``'s, the tables and figures ``eval/paired_report.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.eval.tasks import resolve_tasks

ITEMS_FILE = "items.json"


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair`` for a causal model: trailing spaces of the context move to the
    continuation, the whole string is encoded (no special tokens) and the context's tokens cut off."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def loglikelihoods(model, requests: list[tuple[list[int], list[int]]], batch_size: int = 64) -> list[float]:
    """Summed log-probability of each continuation after its context, as lm-eval's HFLM computes it
    (input = (context + continuation)[:-1]). Requests with the same input (one-token continuations of
    one context) share one forward; inputs are right-padded, which a causal model never reads."""
    import torch

    inputs: dict[tuple[int, ...], list[int]] = {}  # input ids -> request indices
    for i, (ctx, cont) in enumerate(requests):
        if not cont:
            raise LoopDataError("an answer choice encodes to no token; expected non-empty choices")
        inputs.setdefault(tuple((ctx + cont)[:-1]), []).append(i)
    order = sorted(inputs, key=len)
    out = [0.0] * len(requests)
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(x) for x in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for row, x in enumerate(batch):
                ids[row, :len(x)] = torch.tensor(x)
            logprobs = torch.log_softmax(model(ids.to(device), use_cache=False).logits.float(), dim=-1).cpu()
            for row, x in enumerate(batch):
                for i in inputs[x]:
                    cont = requests[i][1]
                    positions = torch.arange(len(x) - len(cont), len(x))
                    out[i] = float(logprobs[row, positions, torch.tensor(cont)].sum())
    return out


def choose(lls: list[float], choices: list[str], metric: str) -> int:
    """The chosen option: argmax log-likelihood (``acc``) or argmax log-likelihood / len(choice)
    in characters (``acc_norm``), lm-eval's definitions (first index on ties, as numpy.argmax)."""
    if metric == "acc":
        return int(np.argmax(lls))
    if metric == "acc_norm":
        return int(np.argmax(np.array(lls) / np.array([float(len(c)) for c in choices])))
    raise LoopConfigError(f"metric {metric!r}: expected acc or acc_norm")


def margin(lls: list[float], gold: int) -> float:
    """The log-probability margin of an item: the log-odds, in nats, of the gold choice against the others,
    ``ll_gold - log sum_{j != gold} exp(ll_j)`` from the summed log-likelihoods. It has no ceiling (an item
    answered right at r = K can still lose confidence at r = 2K), so a paired change of it measures a fall
    that accuracy near 100 % cannot show."""
    others = np.delete(np.asarray(lls, dtype=float), gold)
    top = others.max()
    return float(lls[gold] - (top + np.log(np.exp(others - top).sum())))


def score_items(model, tokenizer, docs: list[dict], metric: str, batch_size: int = 64) -> tuple[list[int], list[float]]:
    """(1 / 0 correct, log-probability margin) per lm-eval multiple-choice doc (``query``, ``choices``,
    ``gold``) at the model's current r."""
    requests, spans = [], []
    for doc in docs:
        first = len(requests)
        requests += [encode_pair(tokenizer, doc["query"], " " + choice) for choice in doc["choices"]]
        spans.append((first, len(requests)))
    lls = loglikelihoods(model, requests, batch_size)
    correct = [int(choose(lls[a:b], doc["choices"], metric) == doc["gold"]) for doc, (a, b) in zip(docs, spans)]
    return correct, [margin(lls[a:b], doc["gold"]) for doc, (a, b) in zip(docs, spans)]


def score_docs(model, tokenizer, docs: list[dict], metric: str, batch_size: int = 64) -> list[int]:
    """1 / 0 per lm-eval multiple-choice doc (``query``, ``choices``, ``gold``) at the model's current r."""
    return score_items(model, tokenizer, docs, metric, batch_size)[0]


def read_docs(path: Path) -> list[dict]:
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; expected a task file written by tools/make_corpus.py")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_depths_of(task_yaml: Path) -> list[int]:
    """``metadata: trained_depths`` of a corpus task YAML (tools/make_corpus.py), [] without."""
    import yaml

    if not task_yaml.is_file():
        return []
    metadata = (yaml.safe_load(task_yaml.read_text()) or {}).get("metadata") or {}
    return [int(d) for d in metadata.get("trained_depths") or []]


def sweep_items(model_dir: str | Path, loops: list[int], task_keys: list[str], include_path: str | Path,
                valid_prefix: str | None = None, seq_length: int | None = None, valid_sequences: int | None = None,
                batch_size: int = 64, label: str | None = None, device: str | None = None,
                log: Callable[[str], None] = print) -> dict:
    """Every item's outcome at every r of ``loops`` for the tasks ``task_keys`` (bundled task keys,
    read from ``include_path/<key>.jsonl``), and the held-out loss per r (with ``valid_prefix``)."""
    import time

    from megatron_loop.eval import heldout
    from megatron_loop.eval.sweep import architecture, set_loops
    from megatron_loop.export.load import export_config, load_hf_model

    specs = resolve_tasks(task_keys)
    include = Path(include_path)
    docs = {s.key: read_docs(include / f"{s.key}.jsonl") for s in specs}
    config = export_config(model_dir)
    model, tokenizer = load_hf_model(model_dir, device)
    for r in loops:  # a NonLoop export refuses r > 1 before any work
        set_loops(model, r)
    arch = architecture(model.config)
    p, s, c, k = arch["prelude_layers"], arch["core_layers"], arch["coda_layers"], arch["train_loops"]
    seq_length = seq_length or int(config.get("train_seq_length") or 2048)
    out: dict[str, Any] = {
        "model": str(Path(model_dir)), "label": label, "layout": f"{p}+{s}x{k}+{c}", **arch,
        "training_depth": p + k * s + c, "loops": list(loops),
        "effective_depth": {str(r): p + r * s + c for r in loops},
        "tasks": {}, "heldout": {}, "seq_length": seq_length if valid_prefix else None,
    }
    for spec in specs:
        items = docs[spec.key]
        out["tasks"][spec.key] = {
            "metric": spec.metric, "group": spec.group, "n": len(items),
            "chance": 100.0 * float(np.mean([1.0 / len(d["choices"]) for d in items])),
            "depth": [d.get("depth") for d in items] if any("depth" in d for d in items) else None,
            "trained_depths": trained_depths_of(include / f"{spec.key}.yaml"),
            "correct": {},  # r -> "0110..." (item i's outcome is character i)
            "margin": {},  # r -> item i's log-probability margin (margin()) in milli-nats, rounded
            # what each item measures, where the corpus says (held-out contexts: seen / in_horizon / beyond)
            **({"split": [d.get("split") for d in items]} if any("split" in d for d in items) else {}),
        }
    for r in loops:
        started = time.time()
        set_loops(model, r)
        line = []
        for spec in specs:
            correct, margins = score_items(model, tokenizer, docs[spec.key], spec.metric, batch_size)
            out["tasks"][spec.key]["correct"][str(r)] = "".join(map(str, correct))
            out["tasks"][spec.key]["margin"][str(r)] = [round(1000.0 * m) for m in margins]
            line.append(f"{spec.key} {100.0 * np.mean(correct):.1f}")
        if valid_prefix:
            out["heldout"][str(r)] = heldout.heldout_loss(model, valid_prefix, seq_length, valid_sequences,
                                                          batch_size=16)
            line.append(f"held-out loss {out['heldout'][str(r)]['loss']:.4f}")
        log(f"r = {r}: " + ", ".join(line) + f" ({time.time() - started:.1f} s)")
    return out


def outcomes(items: dict, task: str, r: int) -> np.ndarray:
    """0/1 outcomes of ``task``'s items at loop count r (items.json)."""
    return np.frombuffer(items["tasks"][task]["correct"][str(r)].encode(), dtype=np.uint8) - ord("0")


def margins(items: dict, task: str, r: int) -> np.ndarray:
    """Log-probability margins (nats) of ``task``'s items at loop count r (items.json)."""
    return np.asarray(items["tasks"][task]["margin"][str(r)], dtype=float) / 1000.0

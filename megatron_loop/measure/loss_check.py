"""Is the LM-head loss right on this device? Each implementation of ``model.loss_implementation``
(``fused``: Liger's Triton kernel; ``chunked``: the torch reference) in the training dtype (bf16)
against an fp32 reference, in value: loss, d loss / d hidden and d loss / d head weight, plus the
host synchronisations of one forward + backward. The kernel check of ``tools/gpu_first.sh``: the
device runs its own Triton (3.6 on the GPU image), whose pairing with this kernel call never ran
anywhere else.

    python -m megatron_loop.measure.loss_check --device cuda --json kernel.json        # Llama + Qwen vocabularies
    python -m megatron_loop.measure.loss_check --device cpu --vocab 512 --hidden 64 --tokens 256   # chunked only

Per vocabulary (default: the Llama 128,256 and Qwen 151,936 heads at their backbones' widths) the
same random hidden states, head weight and targets (one in 16 ignored) run through
:func:`~megatron_loop.model.loss.chunked_linear_cross_entropy` once per implementation in bf16,
and once with ``chunked`` on fp32 copies of the same bf16 values (the reference: the inputs are
equal, only the arithmetic differs). Relative errors: ``|loss - ref| / |ref|``, and
``||g - g_ref|| / ||g_ref||`` for each gradient; a case passes when every error is within its
tolerance (:data:`TOLERANCES`: bf16 rounding of logits and gradients is ~0.4 % per element), every
value is finite and the counted step made no host synchronisation. ``fused`` and ``chunked`` are
also compared with each other. Exit status 0 when every case passes, 1 otherwise (the JSON and the
printed table say which and by how much), 2 on a bad argument.

On CPU ``fused`` runs only under Triton's interpreter (``TRITON_INTERPRET=1``, slow: use a small
vocabulary); by default the CPU check runs ``chunked`` alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Sequence

import torch

from megatron_loop.config import BACKBONES
from megatron_loop.measure.host_sync import count_host_syncs
from megatron_loop.model.loss import (DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, ChunkLoss, chunked_linear_cross_entropy,
                                      triton_interpreter)

# Largest relative error of a bf16 implementation against the fp32 reference. bf16 keeps 8 bits of
# mantissa: logits and gradients are rounded by up to 2^-9 per element, which averages out in the
# summed loss (~1e-5 measured on CPU) and gives ~0.3 % in a gradient's norm; a kernel that mis-scales,
# drops a block of columns or mishandles ignored rows is off by far more.
TOLERANCES = {"loss": 5e-4, "grad_hidden": 2e-2, "grad_weight": 2e-2}
# The vocabularies the shipped configs train (the heads of examples/llama_4x5.yaml, examples/qwen_4x7.yaml).
FAMILIES = {"llama": "llama3.1-1b", "qwen": "qwen3-0.6b"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    denominator = ref.norm().item()
    return (a - ref).norm().item() / denominator if denominator else float("inf")


def _inputs(vocab: int, hidden_size: int, tokens: int, device: torch.device, dtype: torch.dtype, seed: int):
    """Hidden states ~ N(0, 1), head weight ~ N(0, 0.02^2) (the init), uniform targets, 1 in 16 ignored;
    made on the CPU from a seeded generator, so every device sees the same values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(tokens, hidden_size, generator=g).to(device, dtype)
    weight = (0.02 * torch.randn(vocab, hidden_size, generator=g)).to(device, dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[torch.arange(tokens) % 16 == 5] = IGNORE_INDEX
    return hidden, weight, targets.to(device)


def _run(implementation: str | ChunkLoss, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
         chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss and both gradients of one forward + backward (no value read back here)."""
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    loss = chunked_linear_cross_entropy(h, w, targets, chunk, implementation=implementation)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def compare(a: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> dict[str, float]:
    """Relative errors of (loss, grad_hidden, grad_weight) ``a`` against ``ref``."""
    return {f"rel_{name}": _relative(x, y) for name, x, y in zip(("loss", "grad_hidden", "grad_weight"), a, ref)}


def verdict(errors: dict[str, float], finite: bool, host_syncs: int | None,
            tolerances: dict[str, float] = TOLERANCES) -> list[str]:
    """Why a case fails (empty: it passes)."""
    why = [f"{key} = {errors[f'rel_{key}']:.3g} > {tol:g}" for key, tol in tolerances.items()
           if not errors[f"rel_{key}"] <= tol]  # NaN fails too
    if not finite:
        why.append("non-finite loss or gradient")
    if host_syncs:
        why.append(f"{host_syncs} host synchronisation(s) in the step")
    return why


def check_vocab(vocab: int, hidden_size: int, tokens: int, implementations: dict[str, str | ChunkLoss],
                device: torch.device, dtype: torch.dtype = torch.bfloat16, chunk: int = DEFAULT_CHUNK_TOKENS,
                seed: int = 0, tolerances: dict[str, float] = TOLERANCES, label: str = "") -> list[dict]:
    """One row per implementation (and one per pair of implementations) at one vocabulary."""
    hidden, weight, targets = _inputs(vocab, hidden_size, tokens, device, dtype, seed)
    reference = _run("chunked", hidden.float(), weight.float(), targets, chunk)
    shape = {"family": label, "vocab": vocab, "hidden": hidden_size, "tokens": tokens, "dtype": str(dtype)[6:]}
    rows, results = [], {}
    for name, impl in implementations.items():
        row = {**shape, "implementation": name}
        start = time.perf_counter()
        try:
            got = _run(impl, hidden, weight, targets, chunk)  # also the warm-up (Triton compiles here)
            results[name] = got
            where: list[str] = []
            syncs = count_host_syncs(lambda: _run(impl, hidden, weight, targets, chunk), device, where)
        except Exception as e:  # a kernel that does not run on this device/Triton is a failed case, not a crash
            row.update({"pass": False, "why": [f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"],
                        "seconds": time.perf_counter() - start})
            rows.append(row)
            continue
        finite = all(bool(torch.isfinite(t).all()) for t in got)
        errors = compare(got, reference)
        why = verdict(errors, finite, syncs, tolerances)
        row.update({"loss": got[0].item(), "loss_reference": reference[0].item(), **errors, "host_syncs": syncs,
                    "host_sync_sites": sorted(set(where)), "pass": not why, "why": why,
                    "seconds": time.perf_counter() - start})
        rows.append(row)
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1:]:  # implementation vs implementation, same dtype: informative, both must pass alone
            rows.append({**shape, "implementation": f"{a} vs {b}", **compare(results[a], results[b]), "pass": None,
                         "why": []})
    return rows


def default_implementations(device: torch.device) -> list[str]:
    """Both where Liger's kernel runs (CUDA, or CPU under Triton's interpreter), else chunked alone."""
    return ["fused", "chunked"] if device.type == "cuda" or triton_interpreter() else ["chunked"]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def provenance(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"device": name, "torch": torch.__version__, "triton": _version("triton"),
            "liger_kernel": _version("liger_kernel"), "triton_interpret": triton_interpreter()}


def format_rows(rows: list[dict]) -> list[str]:
    lines = [f"{'case':<34} {'loss':>10} {'rel loss':>10} {'rel dH':>10} {'rel dW':>10} {'syncs':>5}  verdict"]
    for r in rows:
        case = f"{r['family'] or 'V'} {r['vocab']} {r['implementation']}"
        if "rel_loss" not in r:
            lines.append(f"{case:<34} {'':>10} {'':>10} {'':>10} {'':>10} {'':>5}  FAIL: {'; '.join(r['why'])}")
            continue
        state = "PASS" if r["pass"] else ("FAIL: " + "; ".join(r["why"]) if r["pass"] is False else "(compared)")
        loss = f"{r['loss']:.5f}" if "loss" in r else ""
        syncs = r.get("host_syncs", "")
        lines.append(f"{case:<34} {loss:>10} {r['rel_loss']:>10.2e} {r['rel_grad_hidden']:>10.2e} "
                     f"{r['rel_grad_weight']:>10.2e} {syncs!s:>5}  {state}")
    return lines


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--families", default="llama,qwen",
                    help="vocabulary and width of these backbones' heads (llama: 128,256 x 1536; qwen: 151,936 x 1024)")
    ap.add_argument("--vocab", default=None, help="comma-separated vocabulary sizes instead of --families")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (with --vocab; default 64)")
    ap.add_argument("--tokens", type=int, default=6144,
                    help="tokens per case (default 6144: one full 4096-token chunk and a partial one)")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_TOKENS)
    ap.add_argument("--implementations", default=None,
                    help="comma-separated (fused, chunked); default: both on CUDA or under TRITON_INTERPRET=1, "
                         "else chunked")
    ap.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    ap.add_argument("--json", default=None, help="write the rows and the verdict here")
    args = ap.parse_args(argv)

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda: no CUDA device visible")
    if args.tokens < 1 or args.chunk < 1:
        return fail(f"--tokens {args.tokens} --chunk {args.chunk}: expected positive integers")
    if args.vocab:
        cases = [("", v, args.hidden or 64) for v in _ints(args.vocab)]
    else:
        unknown = [f for f in args.families.split(",") if f not in FAMILIES]
        if unknown:
            return fail(f"--families {','.join(unknown)}: expected some of {', '.join(FAMILIES)}")
        cases = [(f, BACKBONES[FAMILIES[f]]["vocab_size"], args.hidden or BACKBONES[FAMILIES[f]]["hidden_size"])
                 for f in args.families.split(",")]
    names = args.implementations.split(",") if args.implementations else default_implementations(device)
    if any(n not in ("fused", "chunked") for n in names):
        return fail(f"--implementations {args.implementations}: expected fused and/or chunked")
    start = time.perf_counter()
    info = provenance(device)
    print(f"loss check on {info['device']} (torch {info['torch']}, triton {info['triton']}, liger-kernel "
          f"{info['liger_kernel']}): {', '.join(names)} in {args.dtype} vs an fp32 chunked reference; "
          f"tolerances {TOLERANCES}", flush=True)
    rows = []
    for label, vocab, hidden in cases:
        new = check_vocab(vocab, hidden, args.tokens, {n: n for n in names}, device, DTYPES[args.dtype], args.chunk,
                          label=label)
        rows += new
        for line in format_rows(new)[1:]:
            print(line, flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ok = all(r["pass"] is not False for r in rows) and any(r["pass"] for r in rows)
    result = {"provenance": {**info, "command": " ".join(["python -m megatron_loop.measure.loss_check",
                                                         *(argv if argv is not None else sys.argv[1:])])},
              "tolerances": TOLERANCES, "implementations": names, "rows": rows, "pass": ok,
              "failed": sorted({r["implementation"] for r in rows if r["pass"] is False}),
              "seconds": time.perf_counter() - start}
    if args.json:
        path = Path(args.json)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(path)
    print(f"loss check: {'PASS' if ok else 'FAIL (' + ', '.join(result['failed']) + ')'} "
          f"({result['seconds']:.1f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

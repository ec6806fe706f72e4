"""Liger-Kernel's fused cross-entropy path run on CPU through Triton's interpreter.

Run with ``TRITON_INTERPRET=1`` (set before triton is imported; tests/unit/model/test_loss.py does).
Asserts, exiting non-zero on the first mismatch:

1. ``chunked_linear_cross_entropy(implementation="fused")`` equals the chunked torch reference
   (loss, d/d hidden, d/d weight; ignored targets; fp32 and bf16) and Liger's own public
   ``LigerFusedLinearCrossEntropyFunction`` (same kernel, host-synchronising entry point) for a
   vocabulary inside one kernel block and for one spanning four kernel blocks (the kernel's loop
   over column blocks, its running maximum and sum of exponentials carried across blocks). The
   block is capped at ``SMALL_BLOCK`` columns for that case (``LIGER_MAX_BLOCK``, 32768 on GPU, is
   the same loop with wider blocks; at V = 66k the interpreter takes minutes).
2. A tied-embedding LoopLM (tiny-qwen) with ``loss_implementation=fused`` trains inside
   ``optim.build_engine``'s DeepSpeed engine under ZeRO-3 (the head is the external embedding
   parameter) to the same losses and weights as ``loss_implementation=chunked``.
"""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

SMALL_BLOCK = 256  # kernel columns per block in the several-block case
MULTI_BLOCK_V = 3 * SMALL_BLOCK + 44  # four blocks, the last one partial


def check_function() -> None:
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    from megatron_loop.model import loss as loss_module
    from megatron_loop.model.loss import chunked_linear_cross_entropy

    torch.manual_seed(0)
    full_block = loss_module.LIGER_MAX_BLOCK
    cases = [(dtype, tol, v) for v in (300, MULTI_BLOCK_V)
             for dtype, tol in ((torch.float32, dict(rtol=1e-5, atol=1e-6)), (torch.bfloat16, dict(rtol=2e-2, atol=2e-3)))]
    for dtype, tol, v in cases:
        n, d = 21, 24  # two loss chunks of 16 tokens, the second partial (the interpreter's cost grows with n)
        hidden, weight = torch.randn(n, d).to(dtype), (torch.randn(v, d) * 0.2).to(dtype)
        targets = torch.randint(0, v, (n,))
        targets[[0, 7, 20]] = -100
        loss_module.LIGER_MAX_BLOCK = SMALL_BLOCK if v == MULTI_BLOCK_V else full_block
        names = ("chunked", "fused", "liger")
        results = {}
        for name in names:
            h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
            if name == "liger":
                loss = LigerFusedLinearCrossEntropyFunction.apply(h, w, targets, None, None, -100)[0]
            else:
                loss = chunked_linear_cross_entropy(h, w, targets, chunk_size=16, implementation=name)
            (2.5 * loss).backward()  # a non-unit upstream gradient exercises backward's scaling
            results[name] = (loss.detach().float(), h.grad.float(), w.grad.float())
        for other in names[1:]:
            for a, b, what in zip(results[other], results["chunked"], ("loss", "grad hidden", "grad weight")):
                torch.testing.assert_close(a, b, **tol, msg=lambda m: f"{other} vs chunked, {dtype}, V={v}, {what}: {m}")
        with torch.no_grad():  # the evaluation path (no gradients formed)
            torch.testing.assert_close(chunked_linear_cross_entropy(hidden, weight, targets, 16, implementation="fused"),
                                       results["chunked"][0].to(torch.float32), **tol)
    loss_module.LIGER_MAX_BLOCK = full_block
    print(f"function: fused == chunked == Liger's FLCE (fp32, bf16, ignore_index; V = 300 in one kernel block, "
          f"V = {MULTI_BLOCK_V} in {SMALL_BLOCK}-column blocks)", flush=True)


def check_engine_zero3() -> None:
    from megatron_loop.config import build_model_config
    from megatron_loop.model import build_model
    from megatron_loop.config.deepspeed import DeepSpeedSettings, read_ds_config
    from megatron_loop.parallel.mpu import data_parallel_size
    from megatron_loop.optim import OptimizerSettings, build_engine
    from megatron_loop.parallel.bootstrap import init_world
    from megatron_loop.parallel.parallelize import parallelize
    from megatron_loop.measure.host_sync import find_host_syncs

    init_world()
    vocab = 512  # the interpreter's cost grows with V; the one-block and several-block kernels ran above
    x = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(3))
    runs = {}
    for impl in ("chunked", "fused"):
        cfg = build_model_config(dict(backbone="tiny-qwen", core_layers=1, train_loops=2, compile=False,
                                      vocab_size=vocab, recompute="per_loop",
                                      loss_implementation=impl))
        assert cfg.tie_word_embeddings
        torch.manual_seed(0)
        model = build_model(cfg)
        parallelize(model, zero_stage=3)  # per_loop recomputation; the tied head gathered with the root (ZeRO-3)
        settings = OptimizerSettings(lr=1e-2)
        ds = DeepSpeedSettings.resolve(read_ds_config(zero_stage=3), micro_batch_size=2, grad_accum=1,
                                       data_parallel_size=data_parallel_size(), bf16=False,
                                       grad_clip=settings.grad_clip)
        engine = build_engine(model, settings, ds, total_steps=100).engine
        from deepspeed.utils import safe_get_full_grad

        loss = engine(x, labels=x, compute_logits=False).loss
        engine.backward(loss)
        grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
        engine.step()
        syncs = find_host_syncs(lambda: engine.backward(engine(x, labels=x, compute_logits=False).loss))
        ours = [s for s in syncs if "megatron_loop" in s]
        assert not ours, ours  # DeepSpeed's ZeRO-3 trace checks read a few values; our code none
        print(f"{impl}: host syncs in the engine's forward + backward: {len(syncs)}, all in DeepSpeed "
              f"({sorted({s.split(' at ')[1].rsplit('/', 1)[-1] for s in syncs})})", flush=True)
        engine.zero_grad()
        after = engine(x, labels=x, compute_logits=False).loss  # the loss after one Muon+AdamW update
        runs[impl] = (torch.stack([loss.detach(), after.detach()]), grads)
    torch.testing.assert_close(runs["fused"][0], runs["chunked"][0], rtol=1e-5, atol=1e-6)
    assert runs["chunked"][0][1] < runs["chunked"][0][0]  # the update helped
    for name, g in runs["chunked"][1].items():
        torch.testing.assert_close(runs["fused"][1][name], g, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")
    assert runs["fused"][1]["embed_tokens.weight"].abs().sum() > 0  # the tied head's gradient arrived
    print(f"engine: ZeRO-3, tied embeddings, losses {runs['fused'][0].tolist()} equal chunked", flush=True)


if __name__ == "__main__":
    check_function()
    if "--engine" in sys.argv:
        check_engine_zero3()

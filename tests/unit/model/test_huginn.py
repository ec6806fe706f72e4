"""Huginn (Geiping et al. 2025) as configuration keys: ``model.block_norm: sandwich`` (model/layers.py, the
export's ``modulated_residual``), ``model.norm_core_output``, ``model.initial_state: noise``
(model/initial_state.py) and the HF export's KV-cache sharing (``kv_cache_loops``).

Checked against references written here from Huginn's definitions (seal-rg/recurrent-pretraining,
recpre/raven_modeling_minimal.py): its SandwichBlock with explicit attention arithmetic, its truncated
normal state, its adapter on concat(state, e), and a dictionary KV cache with its "compress-s" slot
rule; the training model against the HF export at several r; the dry-run count; the settings refused.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_loop import LoopConfigError
from megatron_loop.config import build_model_config, config_from_dict
from megatron_loop.export.convert import hf_config, model_config_from_hf, to_hf_state_dict
from megatron_loop.hf.modeling_looplm import (HUGINN_STATE_STD, LoopLMForCausalLM, initial_state_noise,
                                              position_noise)
from megatron_loop.model.initial_state import step_seed
from megatron_loop.model.looplm import build_model
from megatron_loop.plan import count_parameters, training_plan
from megatron_loop.parallel.bootstrap import ensure_groups

HUGINN = dict(backbone="tiny-qwen", prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3, vocab_size=256,
              block_norm="sandwich", norm_core_output=True, initial_injection="dense", initial_state="noise",
              recompute="none", compile=False)

@pytest.fixture(autouse=True, scope="module")
def megatron_groups():
    """megatron-core's own attention (the reference path, or blocks called with rotary angles) reads its
    process groups when it runs; the model is built without any (build_model creates none)."""
    ensure_groups()



def perturb_norms(model: torch.nn.Module, seed: int = 3) -> None:
    """Norm weights off 1, so that each norm's place in the block shapes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def models():
    """The training model (fast path), its megatron-core reference path and its HF export, same weights."""
    cfg = build_model_config(HUGINN)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    perturb_norms(model)
    reference = build_model(cfg, fast_path=False).eval()
    reference.load_state_dict(model.state_dict())
    hf = LoopLMForCausalLM(hf_config(cfg)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model.state_dict(), cfg), strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied to the embedding (Huginn ties them too)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    return cfg, model, reference, hf


def sandwich_block_reference(x: torch.Tensor, w: dict, cfg) -> torch.Tensor:
    """Huginn's SandwichBlock, x = norm_2(attn(norm_1(x)) + x); x = norm_4(mlp(norm_3(x)) + x), with GQA
    attention written out (rotate-half RoPE, causal softmax) and a SwiGLU MLP; x [b, s, d]."""
    def norm(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    b, s, _ = x.shape
    heads, groups, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def attention(t):
        q = (t @ w["q"].T).view(b, s, heads, hd)
        k = (t @ w["k"].T).view(b, s, groups, hd).repeat_interleave(heads // groups, dim=2)
        v = (t @ w["v"].T).view(b, s, groups, hd).repeat_interleave(heads // groups, dim=2)
        if "q_norm" in w:
            q, k = norm(q, w["q_norm"]), norm(k, w["k_norm"])
        angle = torch.arange(s)[:, None] * (1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2) / hd))[None]
        cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]

        def rope(t):
            t1, t2 = t.chunk(2, dim=-1)
            return t * cos + torch.cat([-t2, t1], dim=-1) * sin

        q, k = rope(q), rope(k)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, s, heads * hd)
        return out @ w["o"].T

    x = norm(attention(norm(x, w["norm_1"])) + x, w["norm_2"])
    mlp = (F.silu(norm(x, w["norm_3"]) @ w["gate"].T) * (norm(x, w["norm_3"]) @ w["up"].T)) @ w["down"].T
    return norm(mlp + x, w["norm_4"])


def test_sandwich_block_is_huginns(models):
    """Prelude, Core and Coda blocks are all Huginn's SandwichBlock: the fast path, megatron-core's path
    and the export's block equal the reference (norms after each residual sum as well as before)."""
    cfg, model, reference, hf = models
    state = hf.state_dict()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, cfg.hidden_size, generator=g)
    for part, i in (("prelude", 0), ("core", 1), ("coda", 0)):
        p = f"model.{part}.{i}."
        w = {"q": state[p + "self_attn.q_proj.weight"], "k": state[p + "self_attn.k_proj.weight"],
             "v": state[p + "self_attn.v_proj.weight"], "o": state[p + "self_attn.o_proj.weight"],
             "gate": state[p + "mlp.gate_proj.weight"], "up": state[p + "mlp.up_proj.weight"],
             "down": state[p + "mlp.down_proj.weight"], "q_norm": state[p + "self_attn.q_norm.weight"],
             "k_norm": state[p + "self_attn.k_norm.weight"], "norm_1": state[p + "input_layernorm.weight"],
             "norm_2": state[p + "attn_residual_norm.weight"],
             "norm_3": state[p + "post_attention_layernorm.weight"], "norm_4": state[p + "mlp_residual_norm.weight"]}
        expected = sandwich_block_reference(x, w, cfg)
        with torch.no_grad():
            rope = model._rope(7, x.device)
            fast = getattr(model, part)[i](x.transpose(0, 1), rope).transpose(0, 1)
            mcore = getattr(reference, part)[i](x.transpose(0, 1), rope).transpose(0, 1)
            block = getattr(hf.model, part)[i]
            exported = block(x, hf.model.rotary_emb(torch.arange(7)[None].expand(2, 7), x.dtype), None, None, 0)
        assert torch.equal(fast, mcore)
        torch.testing.assert_close(fast, expected, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(exported, expected, atol=2e-6, rtol=1e-5)


def test_noise_state_is_huginns_truncated_normal():
    """s_0 ~ TruncNormal(0, sigma^2, [-3 sigma, 3 sigma]), sigma = sqrt(2/5) (Huginn's like-init: the takase
    embedding std sqrt(2/(5d)) times the embedding scale sqrt(d)); the std of that law is
    sigma sqrt(1 - 6 phi(3) / (2 Phi(3) - 1)); reproducible from its seed, keyed by position."""
    assert HUGINN_STATE_STD == math.sqrt(2 / 5)
    sigma = 0.5
    x = initial_state_noise((400, 500), sigma, torch.Generator().manual_seed(0))
    phi3 = math.exp(-4.5) / math.sqrt(2 * math.pi)
    std = sigma * math.sqrt(1 - 6 * phi3 / math.erf(3 / math.sqrt(2)))
    assert x.abs().max() <= 3 * sigma and x.abs().max() > 2.9 * sigma
    assert x.mean().abs() < 4 * std / math.sqrt(x.numel())
    assert x.std().item() == pytest.approx(std, rel=5e-3)
    huginn = torch.nn.init.trunc_normal_(torch.empty(400, 500), std=sigma, a=-3 * sigma, b=3 * sigma,
                                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, huginn)  # Huginn's own call on the same generator
    rows = position_noise(7, torch.tensor([[0, 1, 2, 3, 4]]), 16, 32, sigma, torch.float32)
    again = position_noise(7, torch.tensor([[3, 4], [1, 1]]), 16, 32, sigma, torch.float32)
    assert torch.equal(again[0], rows[0, 3:]) and torch.equal(again[1, 0], again[1, 1])
    assert not torch.equal(position_noise(8, torch.tensor([[0]]), 16, 32, sigma, torch.float32)[0, 0], rows[0, 0])


def test_recurrence_runs_from_noise_with_the_prelude_injected_every_step(models):
    """The trajectory starts at s_0 = the position-keyed noise, and each loop is Core(adapter(cat(s, e)))."""
    cfg, model, _, _ = models
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids, num_loops=2, return_trajectory=True)
        s0 = position_noise(cfg.initial_state_seed, torch.arange(6)[None].expand(2, 6), cfg.hidden_size,
                            cfg.max_position_embeddings, HUGINN_STATE_STD, torch.float32)
        assert torch.equal(out.trajectory[0], s0)
        h = model.embed_tokens(ids).transpose(0, 1)
        rope = model._rope(6, ids.device)
        e = model.prelude[0](h, rope)
        state = s0.transpose(0, 1)
        for _ in range(2):
            state = torch.cat([state, e], dim=-1) @ model.initial_injection.weight.T  # Huginn's adapter, no bias
            for block in model.core:
                state = block(state, rope)
        torch.testing.assert_close(out.trajectory[2], state.transpose(0, 1))
    assert not any(n.startswith("initial_injection.bias") for n, _ in model.named_parameters())


def test_adapter_has_huginns_initialisation():
    """W [d, 2d] ~ TruncNormal(0, 2/(5d)) at +-3 std (Huginn's in_proj under takase), not the identity."""
    torch.manual_seed(5)
    w = build_model(build_model_config(dict(HUGINN, hidden_size=256, intermediate_size=64, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=64))).initial_injection.weight
    std = math.sqrt(2 / (5 * 256))
    assert w.shape == (256, 512) and w.abs().max() <= 3 * std
    assert w.std().item() == pytest.approx(std * 0.9866, rel=0.02)


@pytest.mark.parametrize("loops", [1, 3, 6])  # r = 1, K, 2K
def test_hf_export_equals_training_model(models, loops):
    cfg, model, _, hf = models
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(loops))
    with torch.no_grad():
        expected = model(ids, num_loops=loops).logits
        got = hf(ids, num_loops=loops, use_cache=False).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_one_pass_readouts_and_cached_generation_with_noise(models):
    """Position-keyed noise keeps the trajectory independent of r (one pass = per-r passes, bitwise) and
    cached decoding equal to cache-free decoding; a fresh draw per forward (seed None) is a readout obstacle."""
    _, _, _, hf = models
    ids = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        readouts = hf.loop_readouts(ids, [1, 2, 4])
        for r, logits in readouts.items():
            assert torch.equal(logits, hf(ids, num_loops=r, use_cache=False).logits)
        cached = hf.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
        ids_free = ids
        for _ in range(4):
            nxt = hf(ids_free, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids_free = torch.cat([ids_free, nxt], dim=-1)
    assert torch.equal(cached, ids_free)
    hf.config.initial_state_seed = None
    try:
        assert "initial_state_seed" in hf.readout_obstacle([1, 2])
    finally:
        hf.config.initial_state_seed = 0


class HuginnCompressCache:
    """Reference of Huginn's HuginnDynamicCache with lookup "compress-s": entries [slot][position],
    written over by later steps, read back over every position seen. ``update`` receives the slots of a
    model without sharing (p + t s + j in loop t, p + r s + j in the Coda) and maps Core slots as Huginn:
    (index - p) mod (m s) + p."""

    def __init__(self, p: int, s: int, r: int, m: int, depth: int):
        self.p, self.s, self.r, self.m = p, s, r, m
        self.layers = [None] * depth  # the model checks the slot count of a cache it continues
        self.entries: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.seen = 0

    def get_seq_length(self, layer: int = 0) -> int:
        return self.seen

    def update(self, k, v, index, *args, **kwargs):
        n = k.shape[-2]
        if index == 0:
            self.seen += n
        core_end = self.p + self.r * self.s
        if self.p <= index < core_end:
            index = (index - self.p) % (self.m * self.s) + self.p
        entries = self.entries.setdefault(index, {})
        for i in range(n):
            entries[self.seen - n + i] = (k[..., i, :], v[..., i, :])
        keys = torch.stack([entries[t][0] for t in range(self.seen)], dim=-2)
        return keys, torch.stack([entries[t][1] for t in range(self.seen)], dim=-2)


@pytest.mark.parametrize("budget", [1, 2])
def test_kv_cache_sharing_follows_huginns_compress_rule(models, budget):
    """kv_cache_loops = m: Core layer j of loop t reads and writes the slot of loop t mod m. Greedy decoding
    with it equals decoding under the reference cache above (Huginn's rule, applied to a model without
    sharing); the prompt's forward equals the cache-free forward; the cache holds p + m s + c slots; and it
    is not the full cache's decoding (later tokens read earlier tokens' last loops)."""
    cfg, _, _, hf = models
    r, new = 4, 4
    ids = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(6))

    def decode(cache, sharing):
        hf.config.kv_cache_loops = sharing
        try:
            seq, logits = ids, []
            out = hf(seq, num_loops=r, past_key_values=cache, use_cache=True)
            for _ in range(new):
                logits.append(out.logits[:, -1])
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                seq = torch.cat([seq, nxt], dim=-1)
                out = hf(nxt, num_loops=r, past_key_values=cache, use_cache=True)
            return seq, torch.stack(logits), cache
        finally:
            hf.config.kv_cache_loops = None

    from transformers.cache_utils import DynamicCache

    with torch.no_grad():
        shared_seq, shared, cache = decode(DynamicCache(), budget)
        ref_cache = HuginnCompressCache(cfg.prelude_layers, cfg.core_layers, r, budget, hf.config.effective_depth(r))
        ref_seq, ref, _ = decode(ref_cache, None)
        full = decode(DynamicCache(), None)[1]
        prefill = hf(ids, num_loops=r, use_cache=False).logits[:, -1]
    assert len(cache.layers) == cfg.prelude_layers + budget * cfg.core_layers + cfg.coda_layers
    torch.testing.assert_close(shared, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(shared_seq, ref_seq)
    torch.testing.assert_close(shared[0], prefill, atol=1e-5, rtol=1e-5)
    assert (shared[1:] - full[1:]).abs().max() > 1e-3


def test_kv_cache_sharing_with_a_budget_of_every_loop_is_the_full_cache(models):
    _, _, _, hf = models
    ids = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = hf.generate(ids, max_new_tokens=3, do_sample=False, num_loops=3)
        hf.config.kv_cache_loops = 3
        try:
            assert torch.equal(hf.generate(ids, max_new_tokens=3, do_sample=False, num_loops=3), full)
            with pytest.raises(ValueError, match="KV-cache sharing and the freezing exit are not combined"):
                hf.config.kv_cache_loops = 2
                hf(ids, num_loops=3, use_cache=True, exit_criterion="cosine", exit_threshold=0.1)
        finally:
            hf.config.kv_cache_loops = None


def test_training_noise_is_stateless_per_micro_batch(models):
    """A training step's s_0 comes from step_seed(train.seed, step, micro-batch, rank): the same inputs give
    the same loss bit for bit (a resumed run redraws it), other coordinates other noise."""
    _, model, _, _ = models
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(9))
    seeds = {step_seed(42, step, micro, rank) for step in (0, 1) for micro in (0, 1) for rank in (0, 1)}
    assert len(seeds) == 8 and step_seed(42, 1, 0, 1) == step_seed(42, 1, 0, 1)
    seed = step_seed(42, 3, 0, 0)
    with torch.no_grad():
        loss = model(ids, labels=ids, initial_state_seed=seed).loss
        torch.manual_seed(123)  # the global generator plays no part
        assert torch.equal(model(ids, labels=ids, initial_state_seed=seed).loss, loss)
        assert not torch.equal(model(ids, labels=ids, initial_state_seed=seed + 1).loss, loss)


def test_dry_run_counts_the_sandwich_norms_and_the_export_round_trips(models):
    cfg, _, _, hf = models
    plain = build_model_config({**HUGINN, "block_norm": "pre"})
    extra = (build_model(cfg, device="meta").num_parameters() - build_model(plain, device="meta").num_parameters())
    assert extra == 2 * cfg.hidden_size * cfg.physical_depth  # norm_2 and norm_4 of every block
    assert sum(p.numel() for p in hf.parameters()) == build_model(cfg, device="meta").num_parameters()
    assert count_parameters(cfg).total == build_model(cfg, device="meta").num_parameters()  # the --dry-run count
    assert training_plan(config_from_dict({"model": HUGINN})) == training_plan(config_from_dict({"model": {
        **HUGINN, "block_norm": "pre", "initial_state": "prelude"}}))  # the same token budget as pre-norm
    back = model_config_from_hf(hf.config)
    assert (back.block_norm, back.norm_core_output, back.initial_state, back.initial_state_seed) == (
        "sandwich", True, "noise", 0)


@pytest.mark.parametrize("model,parallel,message", [
    ({"timestep": "shortcut"}, {"train": {"shortcut_consistency": True}},
     "model.initial_state='noise' with train.shortcut_consistency=true: expected one of them"),
    ({"initial_injection": "none"}, {}, "model.initial_state='noise': expected 'prelude' unless an initial-state "
                                        "injection carries the Prelude output"),
    ({"block_norm": "post"}, {}, "model.block_norm='post': expected one of ('pre', 'sandwich', 'branch_output')"),
    ({"initial_state_std": 0.0}, {}, "model.initial_state_std=0.0: expected null"),
    ({"initial_state": "prelude", "initial_state_seed": 3}, {}, "model.initial_state_seed=3: expected its default"),
    ({}, {"tensor_model_parallel_size": 2}, "model.initial_state='noise': expected "
                                            "parallel.tensor_model_parallel_size=1"),
])
def test_bad_huginn_settings_name_the_key(model, parallel, message):
    train, parallel = parallel.get("train", {}), {k: v for k, v in parallel.items() if k != "train"}
    with pytest.raises(LoopConfigError) as err:
        config_from_dict({"model": {**HUGINN, **model}, "parallel": parallel, "train": train}, source="c.yaml")
    assert str(err.value).startswith("c.yaml: ") and message in str(err.value)


def test_bf16_step_with_truncated_backprop_reaches_the_prelude_through_the_adapter():
    """As DeepSpeed's bf16 engine runs it (the module cast to bf16): the noise is drawn in fp32 and cast,
    and with Huginn's truncated backpropagation (one graphed loop of three) the embedding and the Prelude
    still get their gradient through the adapter's h0 half, as in Huginn."""
    torch.manual_seed(0)
    model = build_model(build_model_config(HUGINN)).to(torch.bfloat16).train()
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    out = model(ids, labels=ids, initial_state_seed=step_seed(42, 0, 0, 0), backprop_loops=1, return_trajectory=True)
    assert out.trajectory[0].dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    for name in ("embed_tokens.weight", "prelude.0.mlp.linear_fc2.weight", "initial_injection.weight",
                 "prelude.0.attn_residual_norm.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name

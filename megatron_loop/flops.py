"""FLOP accounting over the effective depth L(r) = p + r*s + c (Sec. 2.1).

Model FLOPs per token of one training step (forward + backward = 3 x forward; activation
recomputation is not counted, as in MFU reporting by Megatron-LM, PaLM and OLMo):

    forward per token = L(r) * [2 * (d*H*hd + 2*d*G*hd + H*hd*d + 3*d*ffn)      block matmuls
                                + 2 * 2 * seq * H*hd]                           attention scores + AV
                        + 2 * d * V                                              LM head

Attention is counted over the full seq x seq score matrix (the PaLM / Megatron convention;
a causal kernel skips about half of it). Norms, RoPE, softmax and the scalar / channel-wise
conditioning (scalar and channel injection, Loop / Branch Gating, AdaLN's modulation) are O(d)
per token and left out. Dense injection is not: it is a d x 2d (initial) or d x d (history, per
lag) matmul per token per loop, O(d^2) like the blocks (:func:`conditioning_flops_per_token`),
and is counted, forward and backward, in every loop that runs it:

    dense initial injection   2 * d * 2d           per token per loop (concat(h, h0) @ W.T, W [d, 2d])
    dense history injection   m_l * 2 * d * d      per token in loop l, m_l = min(w, max(l - 1, 0)) lags

(``hf/modeling_looplm.history_window``: the first loops have fewer lags than w, so the history
term is at most w * 2 * d^2 per loop). On the paper's runs at seq 2,048 this adds 1-6 % to the
forward FLOPs per token (at r = K / 3K: Qwen 4x7 dense I +1.8 / +2.0 %, dense H w = 4 +1.8 / +3.4 %,
dense I + H w = 4 +3.5 / +5.4 %; Qwen 2x14 dense I +3.5 %; Llama 4x5 dense I +2.5 %, 2x10 +5.0 %):
the smaller the core, the larger the share.

Hardware FLOPs (:func:`hardware_flops_per_token`) add what activation recomputation recomputes
(blocks only; a recomputed loop's dense injection, at most 2-6 % of it, is not added):
one more forward of the looped block occurrences but the last loop's (``per_loop``: (r-1)*s,
see ``LoopLM.forward``) or of every block (``per_block``: L(r)); ``selective`` recomputes every
other matmul of those blocks (the attention output and down projections,
:func:`selective_recompute_flops_per_token`), ``auto`` per its plan; the LM head is never recomputed.

Truncated backpropagation (``train.backprop_loops`` N < r) counts what is executed:
the forward of all L(r) block occurrences, the backward (2 x forward) of only those with a graph,
the Prelude, the last N loops and the Coda (L_bwd = p + N*s + c), and the LM head:

    train = forward(L(r)) + 2 * [L_bwd * block + dense injection of the last N loops + 2 * d * V]

which is 3 x forward when N >= r. Recomputation then reruns only graphed blocks (``per_loop``:
(N-1)*s, ``per_block``: L_bwd). With sampled loop counts (``train.loop_sampling``) the training
loop passes each step's r, so MFU is per step.

Ouro's exit gate (``model.exit_gate: learned``, ``model/exit_gate.py``): its Stage I objective reads the
Coda and the LM head out after every loop, r - 1 readouts more than a forward at r, each with its
backward (:func:`exit_gate_readout_flops_per_token`: 3 (r - 1) (c * block + 2 d V) per token; the gate
itself is O(d)). Counted for Stage I; Stage II (the LM frozen) runs those readouts without a backward.
"""

from __future__ import annotations

from megatron_loop.config import ModelConfig

H100_BF16_PEAK_FLOPS = 989e12  # dense bf16 peak of one H100 SXM (H200 the same)


def block_matmul_params(cfg: ModelConfig) -> int:
    d, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size


def block_forward_flops_per_token(cfg: ModelConfig, seq_length: int) -> float:
    """One block occurrence: its matmuls plus attention scores and the attention-weighted values."""
    attention = 2 * 2 * seq_length * cfg.num_attention_heads * cfg.head_dim
    return 2 * block_matmul_params(cfg) + attention


def selective_recompute_flops_per_token(cfg: ModelConfig) -> float:
    """The matmuls the selective policy recomputes in one block (``model/recompute.py``: every
    other matmul is kept, so the attention output projection and the MLP down projection are redone)."""
    return 2 * (cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size + cfg.intermediate_size * cfg.hidden_size)


def history_lags(loop: int, window: int) -> int:
    """Lags the history injection reads before loop ``loop`` (0-based): m_l = min(w, max(l - 1, 0))."""
    return min(window, max(loop - 1, 0))


def conditioning_flops_per_token(cfg: ModelConfig, loops: range) -> float:
    """Forward FLOPs per token of the dense injection matmuls in the loops ``loops`` (0-based loop
    indices); 0 without dense injection (the other conditioning is O(d) and not counted)."""
    d = cfg.hidden_size
    total = 0.0
    if cfg.initial_injection == "dense":
        total += len(loops) * 2 * d * 2 * d
    if cfg.history_injection == "dense":
        total += sum(history_lags(loop, cfg.history_window) for loop in loops) * 2 * d * d
    return total


def forward_flops_per_token(cfg: ModelConfig, seq_length: int, num_loops: int | None = None) -> float:
    r = cfg.train_loops if num_loops is None else num_loops
    return (cfg.effective_depth(num_loops) * block_forward_flops_per_token(cfg, seq_length)
            + conditioning_flops_per_token(cfg, range(r)) + 2 * cfg.hidden_size * cfg.vocab_size)


def graphed_loops(cfg: ModelConfig, num_loops: int | None = None, backprop_loops: int | None = None) -> int:
    """Loops that build a graph (and run a backward): min(N, r), or r without truncation."""
    r = cfg.train_loops if num_loops is None else num_loops
    return r if backprop_loops is None else min(backprop_loops, r)


def exit_gate_readout_flops_per_token(cfg: ModelConfig, seq_length: int, num_loops: int | None = None) -> float:
    """Ouro's Stage I: the Coda + LM head readouts of loops 1..r-1, forward and backward (module doc)."""
    if getattr(cfg, "exit_gate", "none") != "learned":
        return 0.0
    r = cfg.train_loops if num_loops is None else num_loops
    readout = cfg.coda_layers * block_forward_flops_per_token(cfg, seq_length) + 2 * cfg.hidden_size * cfg.vocab_size
    return 3 * (r - 1) * readout


def train_flops_per_token(cfg: ModelConfig, seq_length: int, num_loops: int | None = None,
                          backprop_loops: int | None = None) -> float:
    """Forward + backward model FLOPs per token at loop count r (3 x forward without truncation;
    with ``backprop_loops`` N < r the backward covers only the graphed blocks, see the module doc;
    plus Ouro's per-loop readouts with its exit gate)."""
    r = cfg.train_loops if num_loops is None else num_loops
    n = graphed_loops(cfg, r, backprop_loops)
    readouts = exit_gate_readout_flops_per_token(cfg, seq_length, r)
    if n == r:
        return 3 * forward_flops_per_token(cfg, seq_length, num_loops) + readouts
    backward_depth = cfg.prelude_layers + n * cfg.core_layers + cfg.coda_layers
    return readouts + forward_flops_per_token(cfg, seq_length, r) + 2 * (
        backward_depth * block_forward_flops_per_token(cfg, seq_length)
        + conditioning_flops_per_token(cfg, range(r - n, r)) + 2 * cfg.hidden_size * cfg.vocab_size)


def hardware_flops_per_token(cfg: ModelConfig, seq_length: int, num_loops: int | None = None,
                             full_loops: int | None = None, backprop_loops: int | None = None,
                             selective_loops: int = 0) -> float:
    """Model FLOPs plus the forward recomputation of ``cfg.recompute`` (graphed blocks only).

    ``selective`` recomputes the attention output and down projections of every looped block but
    the last loop's; ``auto`` is counted as its upper bound ``per_loop`` unless ``full_loops`` (the
    planned number of recomputed loops) is given, and ``selective_loops`` its selective ones.
    """
    n = graphed_loops(cfg, num_loops, backprop_loops)
    if cfg.recompute == "selective":
        selective_loops = n - 1
    recomputed = {"none": 0, "selective": 0, "per_loop": (n - 1) * cfg.core_layers,
                  "auto": (n - 1 if full_loops is None else full_loops) * cfg.core_layers,
                  "per_block": cfg.prelude_layers + n * cfg.core_layers + cfg.coda_layers}[cfg.recompute]
    return (train_flops_per_token(cfg, seq_length, num_loops, backprop_loops)
            + recomputed * block_forward_flops_per_token(cfg, seq_length)
            + selective_loops * cfg.core_layers * selective_recompute_flops_per_token(cfg))


def mfu(tokens_per_second: float, cfg: ModelConfig, seq_length: int, peak_flops: float,
        num_loops: int | None = None, backprop_loops: int | None = None) -> float:
    return tokens_per_second * train_flops_per_token(cfg, seq_length, num_loops, backprop_loops) / peak_flops

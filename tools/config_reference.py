#!/usr/bin/env python
"""Write docs/CONFIG.md: every config key with its type, default and meaning.

    python tools/config_reference.py            # rewrite docs/CONFIG.md
    python tools/config_reference.py --check    # exit 1 if docs/CONFIG.md is out of date (tests run this)

Types and defaults are read from the dataclasses in ``megatron_loop/config/sections.py``; the meaning
of each key is written here, so a key added without a description fails ``--check``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from megatron_loop.config import BACKBONES, SECTIONS

ROOT = Path(__file__).resolve().parents[1]

DESCRIPTIONS: dict[str, str] = {
    # ---- model (HF export vocabulary, SPEC.md)
    "model.backbone": "Preset from App. C.1 (`llama3.1-1b`, `qwen3-0.6b`, `tiny-llama`, `tiny-qwen`); every other model key overrides it.",
    "model.prelude_layers": "p: Prelude blocks, run once before the loop.",
    "model.core_layers": "s: shared Core blocks, run `train_loops` times in training.",
    "model.train_loops": "K: loop count during training (the training horizon).",
    "model.coda_layers": "c: Coda blocks, run once after the loop.",
    "model.hidden_size": "d, the model width.",
    "model.intermediate_size": "SwiGLU feed-forward width d_ff.",
    "model.num_attention_heads": "Query heads.",
    "model.num_key_value_heads": "Key/value heads (grouped-query attention); must divide the query heads.",
    "model.head_dim": "Per-head dimension (even, for RoPE).",
    "model.vocab_size": "Embedding / LM-head rows; must exceed every token id in the data.",
    "model.rms_norm_eps": "RMSNorm epsilon.",
    "model.rope_theta": "RoPE base frequency.",
    "model.rope_scaling": "`null` or the Llama 3 rule `{rope_type: llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}`.",
    "model.max_position_embeddings": "Maximum context; `train.seq_length` may not exceed it.",
    "model.qk_norm": "Per-head RMSNorm on queries and keys before RoPE (Qwen3).",
    "model.tie_word_embeddings": "Share the embedding and the LM head (Qwen3).",
    "model.initializer_range": "Standard deviation of the N(0, sigma) init of linear and embedding weights (App. C.2: 0.02).",
    "model.initial_injection": "Initial-state injection I_phi(h, h0): `none`, `scalar`, `channel`, `residual_channel`, `dense`.",
    "model.history_injection": "History-state injection operators B_j: `none`, `scalar`, `channel`, `dense`.",
    "model.history_window": "w: number of past recurrent states in the history window (>= 1; only with history_injection).",
    "model.timestep": "Timestep conditioning: `none`, `loop_gating`, `branch_gating`, `adaln`, or `shortcut` (LoopFormer's shortcut modulation: c_l = SiLU(E_t(t_l) + E_dt(dt_l)) from sinusoidal MLP embeddings of time and step size, per core branch [g; s] = W c_l + b in u + g Branch((1 + s) Norm(u)); `megatron_loop/model/shortcut.py`).",
    "model.timestep_grid": "Inference grid for psi(t, dt): `rescaled` (T = r) or `prefix` (T = K, r <= K).",
    "model.recompute": "`none`, `per_loop` (recompute every loop but the last; peak grows by one loop input per loop), `selective` (every loop but the last keeps attention outputs and every other matmul output, torchtitan's op policy, and recomputes the rest), `auto` (the cheapest per-loop mix of none / selective / per_loop within `recompute_budget_gib`) or `per_block`; gradients are identical (`megatron_loop/model/recompute.py`).",
    "model.recompute_budget_gib": "With `recompute: auto`: GiB of activation memory per micro-batch (peak above parameters, gradients, optimizer state); null: 90 % of the GPU minus what is allocated at the first forward and the optimizer state and DeepSpeed gradient buckets still to be allocated (no limit on CPU); the plan is logged with what it assumed.",
    "model.recompute_selective_cost": "With `recompute: auto`: the recomputation cost of one selective loop in loop forwards, in (0, 1]; null: the FLOP share of the two matmuls the selective policy recomputes (attention output and down projections; about 0.3 at the paper's widths). Unmeasured on GPU, where elementwise recomputation adds to it; `tools/bench.py` measures it.",
    "model.compile": "torch.compile each block once and reuse it at every loop (no recompilation when r changes): `true`, `false` or `auto` (on when CUDA is available, except under ZeRO-3, whose compiler-disabled parameter hooks split each block into many graphs; the start-up log says which).",
    "model.loss_implementation": "LM head + cross-entropy: `chunked` (torch, fp32 logits per chunk: the reference), `fused` (Liger-Kernel's Triton kernel; CUDA), `auto` (fused on CUDA, chunked elsewhere). No host synchronisation in either.",
    "model.injection_init_noise": "Std of N(0, sigma^2) noise added to the identity init of `scalar` / `channel` / `residual_channel` initial injection (App. E.1 ablation: 0.03; the paper does not say how the noise enters: here, every coefficient). 0: exact identity.",
    "model.block_norm": "`pre` (the paper's pre-norm blocks), `sandwich` (Huginn's SandwichBlock, Geiping et al. 2025: every Prelude, Core and Coda block also normalises the residual stream after each branch is added, u' = Norm(u + Attn(Norm(u))); 2d more parameters per block) or `branch_output` (Ouro's blocks, Zhu et al. 2025: each branch's output normalised before the residual sum, u' = u + Norm(Attn(Norm(u))); 2d more parameters per block); `megatron_loop/model/layers.py`. Exported to HF.",
    "model.loop_norm": "Ouro's between-loop norm (Zhu et al. 2025, modeling_ouro.py:618): every loop ends in the final RMSNorm (shared, as Ouro's), so the next loop, the exit gate and (without a Coda) the LM head read Norm(h); the final norm is then not applied twice. `hf/modeling_looplm.py` (`loop_transition`, `state_norm`). Exported to HF.",
    "model.norm_core_output": "Huginn: the Coda reads Norm(h^r), the final RMSNorm (same weight) applied to the last recurrent state as well as after the Coda. Exported to HF.",
    "model.initial_state": "`prelude` (h^0 = P(e(x)), the paper) or `noise` (Huginn: the state starts from TruncNormal(0, std^2) at +-3 std, the Prelude output entering every loop through the initial-state injection, which it requires; a `dense` adapter then starts with Huginn's TruncNormal(0, 2/(5d)) initialisation instead of [I 0]; TP = 1 only; `megatron_loop/model/initial_state.py`).",
    "model.initial_state_std": "std of the `noise` initial state; `null`: Huginn's sqrt(2/5) (its embedding std sqrt(2/(5d)) times its embedding scale sqrt(d)).",
    "model.initial_state_seed": "Seed of the `noise` initial state outside training steps (validation, the HF export; position-keyed, so cached decoding equals cache-free decoding). Training steps draw from (train.seed, step, micro-batch, rank): stateless, exact on resume.",
    "model.exit_gate": "`none` or `learned` (Ouro's exit gate, Zhu et al. 2025: lambda_t = sigmoid(w^T RMSNorm(h^t) + b) after every loop, inducing the exit distribution p(t|x) = lambda_t prod_{j<t}(1 - lambda_j), the remainder at the last loop; d + 1 parameters; `megatron_loop/model/exit_gate.py`). Needs `train.exit_gate_objective` and TP = 1. Exported to HF, where `exit_criterion: q_exit` exits each token once its cumulative exit probability reaches q (`tools/eval_loops.py --exit-criterion q_exit`).",
    "model.loop_gating_reference": "What Loop Gating mixes with the core output: `state` (h_l, Eq. loop_level_timestep_gating) or `injected` (the core's input u_l = I(h_l, h0) + history; Sec. 5.2 \"the difference between the shared stack's output and its input\"). Needs `timestep: loop_gating`; exported to HF.",
    # ---- train (App. C.2, Table 3)
    "train.global_batch_size": "Sequences per optimizer update = micro_batch_size x accumulation x data-parallel size.",
    "train.micro_batch_size": "Sequences per rank per forward/backward; accumulation is derived.",
    "train.seq_length": "Packed sequence length in tokens (2,048 in the paper).",
    "train.lr": "Peak learning rate, shared by the Muon and AdamW groups.",
    "train.min_lr_ratio": "Final learning rate / peak at the end of the WSD decay (0.1).",
    "train.warmup_fraction": "Fraction of updates with linear warmup (0.05).",
    "train.stable_fraction": "Fraction of updates at the peak learning rate (0.85); the rest decays.",
    "train.weight_decay": "Decoupled weight decay of both groups (0.1).",
    "train.adam_beta1": "AdamW beta1 (0.9), in [0, 1).",
    "train.adam_beta2": "AdamW beta2 (0.95), in [0, 1).",
    "train.adam_eps": "AdamW epsilon (1e-8), >= 0.",
    "train.muon_momentum": "Muon momentum (0.95), in [0, 1).",
    "train.muon_nesterov": "Nesterov momentum for Muon.",
    "train.muon_ns_steps": "Newton-Schulz iterations per Muon update (5).",
    "train.muon_scale": "`match_rms_adamw` (0.2 sqrt(max(rows, cols))) or `original` (sqrt(max(1, rows/cols))).",
    "train.grad_clip": "Clip the global L2 norm of the raw gradients to this value (1.0).",
    "train.optimizer": "`muon_adamw` (Muon for hidden matrices, AdamW for the rest, App. C.2) or `adamw` (every parameter in AdamW: the pilot of App. D.1, Table 7).",
    "train.muon_conditioning_matrices": "Dense injection matrices (dense initial W = [W_h W_0] as one projection, dense history B_j one per lag) to Muon instead of AdamW. The paper reads both ways: Sec. 2.2 gives Muon the \"hidden matrix parameters\" and AdamW \"other non-matrix parameters\" (these are hidden matrices: Muon, `true`); App. C.2 gives Muon \"the matrix-valued attention and feed-forward projection weights\" and AdamW the vector/scalar parameters (these are neither: the default `false` keeps them on AdamW). AdaLN's W_k^b (2d x 8, acting on the 8 timestep features, not a hidden state) stays on AdamW under either value.",
    "train.train_tokens": "Token budget; `null`: tokens_per_parameter x parameters of the NonLoop L(K) model.",
    "train.max_steps": "Number of updates; overrides the token budget.",
    "train.tokens_per_parameter": "Chinchilla ratio for the default token budget (20).",
    "train.seed": "Seed of initialisation and data order (42).",
    "train.precision": "`auto` (the DeepSpeed JSON's `bf16.enabled`; its `auto`: bf16 on GPU, fp32 on CPU), `bf16` or `fp32` (the JSON must agree). bf16: bf16 weights and activations, fp32 master weights, optimizer states and gradient sums (the DeepSpeed JSON's `data_types.grad_accum_dtype`, see `deepspeed_config`); the console line `precision: ...` at start says what DeepSpeed built.",
    "train.deepspeed_config": "DeepSpeed JSON (`deepspeed_configs/zero1.json`, `zero2.json`, `zero3.json`): ZeRO stage and DeepSpeed's own settings; batch sizes and clipping `\"auto\"` or equal to the YAML's, no optimizer/scheduler block (checked by `--dry-run`). The shipped ones set `data_types.grad_accum_dtype: fp32` (micro-batch gradients summed in fp32: DeepSpeed's BF16_Optimizer at ZeRO 1, which with `bf16.immediate_grad_update: true` frees each bf16 gradient once added to its fp32 buffer, an fp32 gradient partition at ZeRO 2/3; DeepSpeed's default would sum them in bf16) and `communication_data_type: fp32` (the data-parallel sum in fp32, as Megatron-LM's bf16 runs). A bf16 run needs `grad_accum_dtype` set: `fp32`, or `bf16` to accept bf16 sums (then an unset `communication_data_type` is bf16 too).",
    "train.output_dir": "Run folder: metrics.jsonl, checkpoints/, resolved config.",
    "train.save_interval": "Checkpoint every N updates (and at the end).",
    "train.save_final": "Write a checkpoint at the end of the run (`false`: only the interval saves and the save at a stop signal; for benchmark runs, tools/gpu_first.sh).",
    "train.keep_last": "Keep the newest N checkpoints.",
    "train.log_interval": "Log every N updates (a metrics.jsonl record and a console line).",
    "train.eval_interval": "Validation every N updates (0: never).",
    "train.eval_loops": "Loop counts r for validation loss; `null`: K/2, K, 2K (not `[]`: use eval_interval 0).",
    "train.eval_batches": "Validation batches per evaluation (>= 1).",
    "train.resume": "Resume automatically from the newest complete checkpoint in output_dir.",
    "train.schedule_on_resume": "The lr after a resume that changes the schedule (`max_steps` raised): the WSD split is re-derived for the new total (from a stable-phase checkpoint the stable phase goes on and the decay runs over the new end). From a checkpoint already in its decay, `continue_decay` (default) decays linearly from its lr to `min_lr_ratio` x peak at the new end; `rewarm` goes back up to the peak (`rederive`, its older name in the run configs of older checkpoints, is read as `rewarm`). One resume line states the lr of the next update.",
    "train.init_from": "A weights-only start (`megatron_loop/training/init_from.py`), as Megatron-LM's `--pretrained-checkpoint` / `--finetune`: another run's checkpoint folder (`.../train/checkpoints`, its `latest`) or one `global_stepN` folder in it. On a fresh start the model's weights are loaded from it (consolidated over ZeRO shards and TP ranks; any ZeRO stage and precision), and the optimizer, schedule, step counter and data position start fresh; the checkpoint's parameters must have the names and shapes of this model's (checked before the run folder is created). A run whose own `output_dir` holds a checkpoint resumes from it and ignores this key. Ouro's Stage II: train Stage I, then Stage II (`exit_gate_objective: adaptive_gate`) in a new `output_dir` with `init_from` = Stage I's checkpoints. `null`: the model's own initialisation.",
    "train.init_from_missing": "What a start from `init_from` does with parameters of this model that the checkpoint lacks: `error` (refused, naming them) or `keep_init` (they keep their initialisation: an exit gate added to a plain run). Parameters of the checkpoint that this model lacks are always an error.",
    "train.nan_policy": "Non-finite loss or gradient norm: `skip` the update (up to max_consecutive_nonfinite) or `stop` with a checkpoint of the last good state.",
    "train.max_consecutive_nonfinite": "Consecutive skipped updates before the run stops.",
    "train.divergence_lr_factor": "After a stop on non-finite values, the automatic resume from the last good state multiplies `train.lr` by this factor for every stop recorded in `checkpoints/divergence.json` (e.g. 0.5: half the lr after the first, a quarter after the second); `null` resumes at `train.lr` as configured (docs/RELIABILITY.md, divergence).",
    "train.wall_time_limit_s": "Save and exit cleanly after this many seconds (`null`: no limit).",
    "train.exit_interval": "Save and exit once the step is a multiple of N (Megatron-LM's --exit-interval; the schedule stays that of the full run).",
    "train.collective_timeout_s": "Longest wait of any collective (seconds); a rank that stopped or hung makes the others stop with one error instead of blocking for DeepSpeed's 30 minutes.",
    "train.loop_sampling": "Loop count of each micro-batch (or update, `loop_sampling_per`): `fixed` (K, the paper), `poisson_lognormal` (Huginn: 1 + Poisson(LogNormal), mean K) or `uniform` (U{min..max}); drawn from the seed, the step and the micro-batch, the same on every rank (Huginn's released run: `lockstep_n`), logged as `micro_batch_loops` and their mean `train_loops` (`megatron_loop/training/loop_sampling.py`).",
    "train.loop_sampling_per": "`micro_batch` (Huginn's: each micro-batch draws its own loop count, so an update averages several depths) or `step` (one draw per optimizer step, every micro-batch running it). Only with a sampled `loop_sampling`.",
    "train.loop_sampling_sigma": "Log-normal sigma of `poisson_lognormal` (Huginn: 0.5).",
    "train.loop_sampling_min": "Smallest loop count drawn (`uniform`: lower bound; `poisson_lognormal`: draws below are raised to it).",
    "train.loop_sampling_max": "Largest loop count drawn; `null`: 2K - min for `uniform` (mean K), no cap for `poisson_lognormal`.",
    "train.shortcut_consistency": "LoopFormer's training (`megatron_loop/model/shortcut.py`): every micro-batch also runs a short trajectory (M ~ U{1..K-1} steps of sizes n/K summing to 1, drawn from the seed, the step and the micro-batch: LoopFormer draws per micro-batch; the same on every rank, which ZeRO 3 needs) and the loss is CE(full) + w_short CE(short) + w_cons MSE(sg(x_full), x_short) on the final normed states. About 1.5x the loops of a step. Needs K >= 2, `loop_sampling: fixed`, `backprop_loops: null`.",
    "train.shortcut_short_loss_weight": "w_short of `shortcut_consistency`: weight of the short trajectory's cross-entropy (LoopFormer: 0.1).",
    "train.shortcut_consistency_weight": "w_cons of `shortcut_consistency`: weight of the MSE between the full trajectory's (detached) and the short trajectory's final states (LoopFormer: 0.1).",
    "train.exit_gate_objective": "Ouro's objective for `model.exit_gate: learned` (`megatron_loop/model/exit_gate.py`): `entropy_regularized` (Stage I: per token sum_t p(t|x) L^(t) - beta H(p), L^(t) the loss of the prediction read out after loop t, T = the step's loop count) or `adaptive_gate` (Stage II: the LM frozen, the gate trained towards sigmoid(k (max(0, L^(t-1) - L^(t)) - gamma)) by binary cross-entropy); `none` without the gate. Training mode only: validation reports the plain loss at r.",
    "train.exit_entropy_beta": "beta of `entropy_regularized`: weight of the exit distribution's entropy (Ouro: 0.1; -beta H is beta KL(p || uniform) up to a constant).",
    "train.exit_gate_k": "k of `adaptive_gate`: slope of the continuation label sigmoid(k (improvement - gamma)) (Ouro: 50).",
    "train.exit_gate_gamma": "gamma of `adaptive_gate`: the loss improvement a further loop must bring to be worth continuing (Ouro: 0.005).",
    "train.backprop_loops": "Truncated backpropagation: only the last N loops of a step build a graph (the state still flows through the others); `null`: all loops (the paper). Needs an `initial_injection` when it truncates.",
    # ---- data (App. C.1)
    "data.train_prefixes": "Indexed dataset prefixes (P for P.bin/P.idx) to train on.",
    "data.train_weights": "Blending weights, one per train prefix (`null`: equal).",
    "data.valid_prefixes": "Held-out prefixes for validation loss; null: the `_valid` prefix next to the first "
                           "train prefix when it exists; `[]`: no validation.",
    "data.tokenizer": "Tokenizer folder or hub name (vocabulary check, HF export).",
    "data.num_workers": "DataLoader worker processes.",
    "data.worker_timeout_s": "Longest wait (seconds) for a batch from the DataLoader workers; a worker that hung or was stopped (SIGSTOP) makes the run stop with one error line instead of freezing it (docs/RELIABILITY.md).",
    "data.max_epochs": "Most epochs of any train prefix the run's plan may read; more is refused before the first step (`training/preflight.py`), since far beyond a few epochs the model memorises the data; `--dry-run` warns above 4 epochs and says when training would refuse. Raise it for a deliberate overfitting run.",
    "data.order": "`stream` (default, the paper's order, App. C.1): documents packed in the order preprocessing wrote them; `tools/preprocess_data.py --streaming --shuffle-buffer 10000 --seed 42` streams FineWeb-Edu through the paper's 10,000-document shuffle buffer with seed 42, and later epochs repeat that order. `shuffled`: a further seeded permutation of the documents per epoch (`train.seed`), for corpora written in a meaningful order or read for several epochs; the bundled toy configs (`examples/tiny_*.yaml`, the `tools/small_study.sh` twins) use it because they read the generated corpus for several epochs.",
    # ---- logging
    "logging.wandb_project": "Weights & Biases project (`null`: no wandb).",
    "logging.wandb_run_name": "Weights & Biases run name.",
    "logging.wandb_mode": "`auto` (online with WANDB_API_KEY, else offline), `online`, `offline`, `disabled`.",
    "logging.progress_bar": "tqdm progress bar on rank 0, drawn only when stderr is a terminal (none in a log file; the step lines are printed either way).",
    "logging.tensorboard": "TensorBoard event files in OUTPUT_DIR/tensorboard (the scalars of metrics.jsonl).",
    "logging.dynamics_interval": "Every N steps, the loop dynamics on the first held-out batch (per-loop state norms and relative updates, loss at r = K - 1, K, K + 1, timestep gates: `training/dynamics.py`); 0 = off; needs a validation set.",
    "logging.peak_tflops": "Per-device peak TFLOP/s for MFU (`null`: 989 on GPU; on CPU no MFU is logged, since a measured matmul rate moves with the machine's load).",
    # ---- parallel (docs/PARALLELISM.md)
    "parallel.tensor_model_parallel_size": "t: ranks that split every block's heads, query groups and MLP columns and the vocabulary (megatron-core tensor parallelism); must divide those, and the world size (data-parallel size = world / t). TP groups are consecutive ranks, so t <= GPUs per node keeps them inside a node.",
    "parallel.sequence_parallel": "Also split the activations between the TP matmuls (norms, residual stream, conditioning) along the sequence over the TP group: all-reduces become reduce-scatter + all-gather, activation memory of those tensors / t. Needs t > 1 and `train.seq_length` divisible by t.",
}


def _type_name(tp) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "").replace(" | ", " or ")


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated by `python tools/config_reference.py` from `megatron_loop/config/sections.py`.",
        "A config is YAML with the sections below; `--set section.key=value` overrides any key.",
        "Unknown keys and invalid values stop with one error naming the key.",
        "",
    ]
    for section, cls in SECTIONS.items():
        lines += [f"## `{section}:`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            text = DESCRIPTIONS.get(f"{section}.{f.name}", "")
            lines.append(f"| `{f.name}` | `{_type_name(f.type)}` | `{default!r}` | {text} |")
        lines.append("")
    lines += ["## Backbone presets (App. C.1, Table 1)", "", "| backbone | fields |", "|---|---|"]
    for name, fields in BACKBONES.items():
        lines.append(f"| `{name}` | " + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + " |")
    return "\n".join(lines) + "\n"


def missing_descriptions() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if f"{s}.{f.name}" not in DESCRIPTIONS]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="fail if docs/CONFIG.md is not up to date")
    p.add_argument("--output", default=str(ROOT / "docs" / "CONFIG.md"))
    args = p.parse_args(argv)
    missing = missing_descriptions()
    if missing:
        print(f"error: tools/config_reference.py: no description for {', '.join(missing)}", file=sys.stderr)
        return 1
    text = render()
    out = Path(args.output)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"error: {out} is out of date; run python tools/config_reference.py", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    from megatron_loop.cli import run_cli  # a full disk or Ctrl-C: one line

    sys.exit(run_cli(main))

"""``MuonAdamW``: one torch optimizer holding the paper's two groups (App. C.2 "Optimizer").

* group ``"muon"`` (role ``matrix``): Muon, momentum 0.95, Nesterov, 5 Newton-Schulz steps,
  per-projection orthogonalisation and RMS scaling (:mod:`megatron_loop.optim.muon`);
* group ``"adamw"`` (embedding, head, norm, conditioning): AdamW, betas (0.9, 0.95), eps 1e-8,
  computed by ``torch.optim.adamw.adamw`` itself so it is AdamW to the last bit;
* decoupled weight decay 0.1 and ONE learning rate on both (the WSD scheduler multiplies both).

It is a plain ``torch.optim.Optimizer``, so DeepSpeed can wrap it (``zero_allow_untested_optimizer``)
and ZeRO keeps its state (Muon momentum included) in ``optimizer.state_dict()`` and in its
checkpoints. It works on three kinds of parameters:

* whole model weights (no DeepSpeed, or DeepSpeed ZeRO stage 0): Muon runs on the weight itself
  (DeepSpeed's own Muon silently runs SGD at stage 0, DeepSpeed#8441) and, when ``clip_grad`` is
  set, the optimizer clips the global norm of the raw gradients itself and records it in
  ``_global_grad_norm`` (which the DeepSpeed engine reports);
* flat ZeRO 1/2/3 partitions carrying a :class:`~megatron_loop.optim.partitions.ZeroPartition`: the
  momentum is kept on the partition; the Newton-Schulz input is gathered to whole matrices,
  orthogonalised per projection, and the local slice of the update applied. ZeRO has already
  clipped the raw gradients with one global norm (so clipping happens before
  orthogonalisation, unlike DeepSpeed's Muon, DeepSpeed#8439); ``clip_grad`` must then be None.

Groups come from roles (:func:`megatron_loop.model.roles.uses_muon`), never from names
(DeepSpeed's Muon tags by name and overwrites flags, DeepSpeed#8438). Two ablation switches
choose the grouping (:func:`role_param_groups`): ``train.optimizer: adamw`` puts every parameter
in the AdamW group (App. D.1, Table 7: the pilot that chose Muon), and
``train.muon_conditioning_matrices`` moves the dense injection matrices to Muon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.optim.adamw import adamw as adamw_functional

from megatron_loop.config import OPTIMIZERS
from megatron_loop.model import roles
from megatron_loop.optim.partitions import ZeroPartition
from megatron_loop.optim.muon import SCALE_RULES, ScaleRule, momentum_input_
from megatron_loop.optim import muon_tp as tp_muon
from megatron_loop.parallel.mpu import model_parallel_unit

MUON_GROUP = "muon"
ADAMW_GROUP = "adamw"


def role_param_groups(model: torch.nn.Module, optimizer: str = "muon_adamw",
                      muon_conditioning_matrices: bool = False) -> list[dict]:
    """The two param groups ``[muon, adamw]`` of ``model``'s trainable parameters, by role.

    ``optimizer="muon_adamw"`` (App. C.2): hidden matrices to Muon, the rest to AdamW; the dense
    injection matrices join Muon only with ``muon_conditioning_matrices``. ``"adamw"``: every
    parameter to AdamW (the optimizer ablation, App. D.1). Raises if a parameter has no role
    (roles.role_of). A group can be empty (e.g. a model without matrices); empty groups are
    dropped because DeepSpeed cannot flatten them.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {OPTIMIZERS}")
    muon, adamw = [], []
    for param in model.parameters():
        if param.requires_grad:
            to_muon = optimizer == "muon_adamw" and roles.uses_muon(param, muon_conditioning_matrices)
            (muon if to_muon else adamw).append(param)
    for param in muon:
        stacked = param.ndim == 3 and roles.projection_rows(param) is not None  # roles.StackSplit
        if param.ndim != 2 and not stacked:
            raise ValueError(f"a Muon parameter must be 2-D (or a StackSplit stack of matrices), "
                             f"got shape {tuple(param.shape)}")
    groups = [{"name": MUON_GROUP, "muon": True, "params": muon}, {"name": ADAMW_GROUP, "muon": False, "params": adamw}]
    return [group for group in groups if group["params"]]


class MuonAdamW(torch.optim.Optimizer):
    """Muon for ``group["muon"]`` groups, AdamW for the others; see the module docstring."""

    def __init__(
        self,
        param_groups: Iterable[dict],
        *,
        lr: float,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        muon_scale: ScaleRule = "match_rms_adamw",
        clip_grad: float | None = None,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise ValueError(f"invalid lr={lr}, weight_decay={weight_decay} or momentum={momentum}")
        if muon_scale not in SCALE_RULES:
            raise ValueError(f"unknown Muon scale rule {muon_scale!r}; expected one of {SCALE_RULES}")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            betas=tuple(betas),
            eps=eps,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            muon_scale=muon_scale,
            muon=False,
        )
        super().__init__(list(param_groups), defaults)
        self.clip_grad = clip_grad
        self._global_grad_norm: float | None = None
        # id(partition) -> (partition, layout). Kept here, not as a tensor attribute, because
        # ZeRO pickles its fp32 partitions into checkpoints (with their attributes).
        self._layouts: dict[int, tuple[torch.Tensor, ZeroPartition]] = {}

    @staticmethod
    def state_tensors(group: dict) -> int:
        """Parameter-sized state tensors a step keeps per parameter of ``group``: Muon's momentum,
        AdamW's two moments (``optim/memory.py`` counts them before they exist)."""
        return 1 if group["muon"] else 2

    def set_partition(self, partition: torch.Tensor, layout: ZeroPartition) -> None:
        """Declare ``partition`` (a ZeRO fp32 flat partition) laid out as ``layout``."""
        if partition.numel() != layout.partition_numel:
            raise ValueError(f"partition has {partition.numel()} elements, its layout {layout.partition_numel}")
        self._layouts[id(partition)] = (partition, layout)

    def layout_of(self, tensor: torch.Tensor) -> ZeroPartition | None:
        entry = self._layouts.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.clip_grad is not None:
            self._global_grad_norm = self._clip_raw_gradients(self.clip_grad)
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _clip_raw_gradients(self, max_norm: float) -> float:
        """Clip whole-weight gradients before any update (single process or ZeRO stage 0)."""
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if any(self.layout_of(p) is not None for p in params):
            raise RuntimeError("ZeRO partitions are clipped by DeepSpeed; build MuonAdamW with clip_grad=None")
        mpu = model_parallel_unit()
        if mpu is not None:  # TP shards: DeepSpeed's norm sums over the TP group, replicated weights once
            from deepspeed.runtime.utils import clip_grad_norm_

            return float(clip_grad_norm_(params, max_norm, mpu=mpu))
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def _muon_step(self, group: dict) -> None:
        lr, decay = group["lr"], group["weight_decay"]
        for param in group["params"]:
            if param.grad is None:
                continue
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            elif state["momentum_buffer"].dtype != param.dtype:
                # a checkpoint from another precision: keep the momentum in the master weights'
                # dtype (fp32 under ZeRO) rather than fail in lerp_ (DeepSpeed#7746, #8433)
                state["momentum_buffer"] = state["momentum_buffer"].to(param.dtype)
            direction = momentum_input_(state["momentum_buffer"], param.grad, group["momentum"], group["nesterov"])

            def orthogonalize(matrix: torch.Tensor, weight: torch.nn.Parameter) -> torch.Tensor:
                # a TP shard is orthogonalised as the whole matrix, gathered over the TP group
                return tp_muon.tensor_parallel_update(matrix, weight, steps=group["ns_steps"],
                                                      rule=group["muon_scale"])

            layout = self.layout_of(param)
            if layout is not None:
                update = layout.map_full(direction, orthogonalize)
            elif param.ndim in (2, 3):  # 3-D: a StackSplit stack, checked by role_param_groups
                update = orthogonalize(direction, param)
            else:
                raise RuntimeError(
                    f"Muon got a {tuple(param.shape)} tensor without a partition layout; "
                    "ZeRO partitions need megatron_loop.optim.engine.attach_zero_layouts"
                )
            param.mul_(1 - lr * decay)
            param.add_(update, alpha=-lr)

    def _adamw_step(self, group: dict) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for param in group["params"]:
            if param.grad is None:
                continue
            state = self.state[param]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            params.append(param)
            grads.append(param.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw_functional(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=False,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

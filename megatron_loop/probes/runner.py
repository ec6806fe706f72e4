"""Probe execution: one hooked forward per loop count and chunk, then batched skip runs.

For each inference loop count L and each chunk of probe sequences (streaming, App. C.4):

* one normal forward with :class:`~megatron_loop.probes.hooks.OccurrenceHooks` records, at
  every block occurrence, the block angle / relative update at p_n, the input and output
  variances over T, and the baseline update u_j over T; the returned trajectory x^(0..L)
  gives the loop metrics. z^(t) and y^(t) are the input of the first and the output of the
  last shared block of loop t, so the amplification factors need no extra pass;
* skip runs for the computational interaction: k sources at once, the chunk repeated k times
  along the batch, batch copy c having occurrence ``sources[c]`` replaced by its input; at
  each later occurrence j the change |u^(-i)_j - u_j| is summed over T.

Sums are kept in float64 and divided at the end, so the result does not depend on the chunk
size. The per-sequence terms at p_n (block and loop angles, loop updates) and the per-token state
variances are also summed squared, which gives each mean's standard error (``*_stderr``: over the
N sequences, or over the |T| positions for the variance) for the figures' bands. Runs on whatever device the model is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from megatron_loop.errors import LoopConfigError
from megatron_loop.probes import metrics
from megatron_loop.probes.hooks import OccurrenceHooks
from megatron_loop.probes.positions import EffectivePositions
from megatron_loop.probes.sampling import ProbeSample, last_positions


@dataclass
class ProbeSettings:
    """``sources``: ``all`` (every occurrence with a later one), ``beyond_training`` (shared
    occurrences in loops > L_tr, what C(d) needs), ``none``, or one-based positions."""

    loops: Sequence[int]
    sources: str | Sequence[int] = "all"
    batch_size: int = 1  # sequences per chunk
    skip_batch: int = 4  # skip configurations per forward
    progress: bool = True


def layout_of(model: torch.nn.Module, num_loops: int) -> EffectivePositions:
    cfg = model.config
    return EffectivePositions(cfg.prelude_layers, cfg.core_layers, cfg.coda_layers, num_loops)


def resolve_sources(spec: str | Sequence[int], layout: EffectivePositions, train_loops: int) -> list[int]:
    """Skip sources for one layout (positions < D; the last occurrence has no downstream target)."""
    if spec == "none":
        return []
    if spec == "all":
        return list(range(1, layout.depth))
    if spec == "beyond_training":
        return [p for p, r in enumerate(layout.loops_of(), start=1)
                if r is not None and r > train_loops and p < layout.depth]
    if isinstance(spec, str):
        raise LoopConfigError(f"interaction sources {spec!r}: expected all, beyond_training, none or positions")
    return sorted({int(p) for p in spec if 1 <= int(p) < layout.depth})


class _Sums:
    """float64 running sums of one loop count (block, loop and interaction terms)."""

    def __init__(self, depth: int, loops: int, device: torch.device):
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        self.block_angle, self.block_update = z(depth), z(depth)
        self.input_variance, self.output_variance, self.update_norm = z(depth), z(depth), z(depth)
        self.loop_angle, self.loop_update, self.state_variance = z(loops), z(loops), z(loops + 1)
        # sums of squares of the same per-sequence (per-token for the variance) terms: their spread
        self.block_angle_sq, self.loop_angle_sq, self.loop_update_sq = z(depth), z(loops), z(loops)
        self.state_variance_sq = z(loops + 1)
        self.response = z(depth, depth)  # N sums, [source - 1, target - 1]
        self.sequences = 0
        self.tokens = 0


def _selected(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of the selected positions T: ``h`` [s, b, d] (block layout), ``mask`` [b, s] -> [|T|, d]."""
    return h.transpose(0, 1)[mask].float()


def _at_last(h: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The state at p_n of every sequence: ``h`` [b, s, d] -> [b, d]."""
    return h[torch.arange(h.shape[0], device=h.device), last].float()


class GeometryProbe:
    """Runs the App. C.4 probes of one model over one :class:`ProbeSample`."""

    def __init__(self, model: torch.nn.Module, sample: ProbeSample, settings: ProbeSettings):
        self.model = model.eval()
        self.sample = sample
        self.settings = settings
        self.train_loops = int(model.config.train_loops)
        self.device = next(model.parameters()).device
        if any(int(L) < 1 for L in settings.loops):
            raise LoopConfigError(f"loops {list(settings.loops)}: expected integers >= 1")
        if settings.batch_size < 1 or settings.skip_batch < 1:
            raise LoopConfigError("batch_size and skip_batch must be >= 1")

    # ------------------------------------------------------------------ passes
    def _normal_pass(self, sums: _Sums, layout: EffectivePositions, tokens: torch.Tensor, mask: torch.Tensor,
                     keep_updates: bool) -> dict[int, torch.Tensor]:
        last = last_positions(mask)
        updates: dict[int, torch.Tensor] = {}

        def record(pos: int, h_in: torch.Tensor, h_out: torch.Tensor) -> None:
            i = pos - 1
            a_in, a_out = _at_last(h_in.transpose(0, 1), last), _at_last(h_out.transpose(0, 1), last)
            angle = metrics.angular_distance(a_in, a_out)
            sums.block_angle[i] += angle.sum()
            sums.block_angle_sq[i] += angle.square().sum()
            sums.block_update[i] += metrics.relative_update(a_in, a_out).sum()
            t_in, t_out = _selected(h_in, mask), _selected(h_out, mask)
            sums.input_variance[i] += metrics.token_variance(t_in).sum()
            sums.output_variance[i] += metrics.token_variance(t_out).sum()
            u = t_out - t_in
            sums.update_norm[i] += u.double().norm(dim=-1).sum()
            if keep_updates:
                updates[pos] = u
            return None

        hooks = OccurrenceHooks(self.model, record)
        with hooks:
            out = self.model(tokens[:, :-1], num_loops=layout.num_loops, return_trajectory=True,
                             compute_logits=False)
        if hooks.position != layout.depth:
            raise LoopConfigError(f"saw {hooks.position} block occurrences, expected D={layout.depth}")
        states = [_at_last(x, last) for x in out.trajectory]
        for t in range(layout.num_loops):
            angle = metrics.angular_distance(states[t], states[t + 1])
            update = metrics.relative_update(states[t], states[t + 1])
            sums.loop_angle[t] += angle.sum()
            sums.loop_update[t] += update.sum()
            sums.loop_angle_sq[t] += angle.square().sum()
            sums.loop_update_sq[t] += update.square().sum()
        for t, x in enumerate(out.trajectory):
            variance = metrics.token_variance(x[mask].float())
            sums.state_variance[t] += variance.sum()
            sums.state_variance_sq[t] += variance.square().sum()
        sums.sequences += tokens.shape[0]
        sums.tokens += int(mask.sum())
        return updates

    def _skip_pass(self, sums: _Sums, layout: EffectivePositions, tokens: torch.Tensor, mask: torch.Tensor,
                   sources: list[int], updates: dict[int, torch.Tensor]) -> None:
        k, b = len(sources), tokens.shape[0]
        source_pos = torch.tensor(sources, device=self.device)
        source_of_row = source_pos.repeat_interleave(b)  # batch copy c (rows c*b .. c*b+b-1) skips sources[c]
        first, skip_set = min(sources), set(sources)

        def skip_and_compare(pos: int, h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor | None:
            if pos in skip_set:  # this occurrence's output becomes its input in its batch copy
                h_out = torch.where((source_of_row == pos)[None, :, None], h_in, h_out)
            if pos > first:  # target j = pos; only sources i < j form pairs
                u = (h_out - h_in).transpose(0, 1).reshape(k, b, *h_in.shape[::2])[:, mask].float()
                change = metrics.update_change_norm(u, updates[pos].unsqueeze(0)).sum(dim=1)  # [k]
                sums.response[source_pos - 1, pos - 1] += torch.where(source_pos < pos, change, 0.0)
            return h_out

        hooks = OccurrenceHooks(self.model, skip_and_compare)
        with hooks:
            self.model(tokens[:, :-1].repeat(k, 1), num_loops=layout.num_loops, compute_logits=False)

    # ------------------------------------------------------------------ driver
    def run(self) -> dict:
        loops = sorted({int(L) for L in self.settings.loops})
        reference_added = min(loops) < self.train_loops and self.train_loops not in loops
        if reference_added:  # V~ of under-unrolled runs is normalised by the L_tr run's V(x^{L_tr})
            loops = sorted(loops + [self.train_loops])
        layouts = {L: layout_of(self.model, L) for L in loops}
        sources = {L: [] if reference_added and L == self.train_loops  # the added run only gives V(x^{L_tr})
                   else resolve_sources(self.settings.sources, layouts[L], self.train_loops) for L in loops}
        chunks = -(-self.sample.num_sequences // self.settings.batch_size)
        total = sum(chunks * (1 + -(-len(sources[L]) // self.settings.skip_batch)) for L in loops)
        bar = tqdm(total=total, desc="geometry probe", unit="pass", disable=not self.settings.progress)
        results = {}
        with torch.inference_mode():
            for L in loops:
                sums = _Sums(layouts[L].depth, L, self.device)
                for tokens, mask in self.sample.chunks(self.settings.batch_size):
                    tokens, mask = tokens.to(self.device), mask.to(self.device)
                    updates = self._normal_pass(sums, layouts[L], tokens, mask, keep_updates=bool(sources[L]))
                    bar.update(1)
                    for start in range(0, len(sources[L]), self.settings.skip_batch):
                        group = sources[L][start:start + self.settings.skip_batch]
                        self._skip_pass(sums, layouts[L], tokens, mask, group, updates)
                        bar.update(1)
                    del updates
                results[L] = summarize(sums, layouts[L], self.train_loops, sources[L])
        bar.close()
        reference = results[self.train_loops]["loop"]["state_variance"][self.train_loops] \
            if self.train_loops in results else None
        for L, result in results.items():
            normalize_variance(result, self.train_loops, reference)
        return {
            "train_loops": self.train_loops,
            "layout": {"prelude": self.model.config.prelude_layers, "shared": self.model.config.core_layers,
                       "coda": self.model.config.coda_layers},
            "sampling": {"num_sequences": self.sample.num_sequences, "num_positions": self.sample.num_positions,
                         "seq_length": int(self.sample.tokens.shape[1]), "fingerprint": self.sample.fingerprint()},
            "reference_loops_added": [self.train_loops] if reference_added else [],
            "loops": {str(L): results[L] for L in loops},
        }


# ---------------------------------------------------------------------- reduction to metrics
def summarize(sums: _Sums, layout: EffectivePositions, train_loops: int, sources: list[int]) -> dict:
    """Per-loop-count metrics of App. C.4 from the running sums (plain Python types)."""
    n, tokens, L = sums.sequences, sums.tokens, layout.num_loops
    as_list = lambda x: None if x is None else [float(v) for v in x.cpu()]  # noqa: E731
    input_var = as_list(sums.input_variance / tokens)
    output_var = as_list(sums.output_variance / tokens)
    state_var = as_list(sums.state_variance / tokens)
    z_var = [input_var[layout.first_shared(t) - 1] for t in range(L)]
    y_var = [output_var[layout.last_shared(t) - 1] for t in range(L)]
    factors = metrics.amplification_factors(state_var, z_var, y_var)
    result = {
        "num_loops": L,
        "effective_depth": layout.depth,
        "segments": layout.segments(),
        "loop_of": layout.loops_of(),
        "block": {"angle": as_list(sums.block_angle / n), "relative_update": as_list(sums.block_update / n),
                  "input_variance": input_var, "output_variance": output_var,
                  "angle_stderr": as_list(metrics.standard_error(sums.block_angle, sums.block_angle_sq, n))},
        "loop": {"angle": as_list(sums.loop_angle / n), "relative_update": as_list(sums.loop_update / n),
                 "state_variance": state_var,
                 "angle_stderr": as_list(metrics.standard_error(sums.loop_angle, sums.loop_angle_sq, n)),
                 "relative_update_stderr": as_list(metrics.standard_error(sums.loop_update, sums.loop_update_sq, n)),
                 "state_variance_stderr": as_list(metrics.standard_error(sums.state_variance,
                                                                         sums.state_variance_sq, tokens))},
        "amplification": {**factors, "injected_variance": z_var, "core_output_variance": y_var},
        "interaction": interaction_summary(sums, layout, train_loops, sources),
    }
    if L >= train_loops:
        result["amplification"]["telescoping"] = {
            "product": metrics.telescoping_product(factors, train_loops),
            "variance_ratio": metrics.safe_ratio(state_var[L], state_var[train_loops])}
    return result


def interaction_summary(sums: _Sums, layout: EffectivePositions, train_loops: int, sources: list[int]) -> dict | None:
    """N_{i->j}, B_j, C_{i->j} (null where not measured) and their loop-lag means over P_d."""
    if not sources:
        return None
    depth, tokens = layout.depth, sums.tokens
    baseline = [float(v) for v in (sums.update_norm / tokens).cpu()]
    raw = (sums.response / tokens).cpu()
    numerator: list[list[float | None]] = [[None] * depth for _ in range(depth)]
    response: list[list[float | None]] = [[None] * depth for _ in range(depth)]
    for i in sources:
        for j in range(i + 1, depth + 1):
            numerator[i - 1][j - 1] = float(raw[i - 1, j - 1])
            response[i - 1][j - 1] = metrics.relative_response(numerator[i - 1][j - 1], baseline[j - 1])
    pairs = metrics.lag_pairs(layout.loops_of(), train_loops)
    measured = all(numerator[i - 1][j - 1] is not None for members in pairs.values() for i, j in members)
    by_lag = None
    if pairs and measured:
        baseline_matrix = [[baseline[j] for j in range(depth)] for _ in range(depth)]
        by_lag = {"lags": list(pairs), "pairs": [len(m) for m in pairs.values()],
                  "C": list(metrics.lag_means(response, pairs).values()),
                  "N": list(metrics.lag_means(numerator, pairs).values()),
                  "B": list(metrics.lag_means(baseline_matrix, pairs).values())}
    return {"sources": sources, "B": baseline, "N": numerator, "C": response, "by_lag": by_lag}


def normalize_variance(result: dict, train_loops: int, reference: float | None) -> None:
    """Adds V~(t) = V(x^t) / V(x^{L_tr}), Eq. (probing_variance_normalization): the run's own
    x^{L_tr} when L >= L_tr (so V~(L) equals the telescoping product), else the L_tr run's."""
    loop = result["loop"]
    own = result["num_loops"] >= train_loops
    ref = loop["state_variance"][train_loops] if own else reference
    loop["variance_reference"] = ref
    loop["variance_reference_source"] = "same run" if own else f"run with L={train_loops}"
    loop["normalized_state_variance"] = (None if ref is None
                                         else metrics.normalized_variance(loop["state_variance"], ref))
    if loop.get("state_variance_stderr") is not None:  # none with one position, or in older reports
        loop["normalized_state_variance_stderr"] = (
            None if ref is None else metrics.normalized_variance(loop["state_variance_stderr"], ref))

"""Probe execution: hooked forwards per chunk of probe sequences, then batched skip runs.

For each chunk of probe sequences (streaming, App. C.4) and each inference loop count L:

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

One pass for every L (``eval/one_pass.py`` decides, for the export this model converts to, and says
why): where the trajectory x^(0), x^(1), ... does not depend on L (no timestep conditioning, or the
``prefix`` grid with L <= K), the forward at L_max holds every smaller L's prelude and loop occurrences
l <= a + s L and its states x^(0..L) exactly; only the Coda differs, so it runs once more per smaller
L on x^(L) (``OccurrenceHooks.run_coda``, the Coda readout at L). Each skip run of a prelude or loop
occurrence is one forward at the largest L that skips it, with the Coda readouts of the smaller L; a
Coda occurrence of L is skipped in a Coda readout on the normal x^(L). Every term is then the same
computation on the same inputs as in a forward at L, so the report is bitwise that of one pass per L
(on CPU; skip copies are batched in other groups, which moves them no more than ``skip_batch`` does).
Elsewhere (the ``rescaled`` grid, t_l = l / L) every L has its own forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from megatron_loop.errors import LoopConfigError
from megatron_loop.eval.one_pass import SweepPasses, sweep_passes
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
    one_pass: bool = True  # every L from forwards at L_max where the trajectory allows (eval/one_pass.py)


def probe_passes(model: torch.nn.Module, loops: Sequence[int], allowed: bool = True) -> SweepPasses:
    """One pass for every loop count or one per L: ``eval.one_pass.sweep_passes`` asked of the export this
    model converts to (``export.convert.hf_config``, built on the meta device: no memory), so the export's
    ``readout_obstacle`` decides for the probes too, in the same words."""
    from megatron_loop.export.convert import hf_config  # transformers: loaded when a probe runs
    from megatron_loop.hf.modeling_looplm import LoopLMForCausalLM

    config = hf_config(model.config)
    with torch.device("meta"):
        if config.model_type == "looplm":
            export = LoopLMForCausalLM(config)
        else:  # NonLoop without conditioning exports as Llama / Qwen3 (no loop count: per L)
            from transformers import AutoModelForCausalLM
            export = AutoModelForCausalLM.from_config(config)
    return sweep_passes(export, loops, allowed)


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


class _Occurrences:
    """Whose effective position each block call is. In a forward at ``top``, a prelude or loop occurrence
    l <= a + s L is position l of every L <= ``top`` (the trajectory is a prefix: one-pass sweeps) and a
    Coda call belongs to ``top`` alone; during the Coda readout at L (``readout``), to L alone."""

    def __init__(self, layouts: dict[int, EffectivePositions]):
        self.layouts = layouts
        self.loops = sorted(layouts)
        self.trunk = {L: layout.depth - layout.coda for L, layout in layouts.items()}  # a + s L
        self.top = self.loops[-1]
        self.readout: int | None = None

    def owners(self, pos: int) -> list[int]:
        if self.readout is not None:
            return [self.readout]
        if pos > self.trunk[self.top]:
            return [self.top]
        return [L for L in self.loops if L <= self.top and pos <= self.trunk[L]]

    def key(self, L: int, pos: int) -> int | tuple[int, int]:
        """Where the normal pass keeps u at ``pos`` of L: one entry per prelude or loop occurrence for every
        L, one per Coda occurrence of each L."""
        return pos if pos <= self.trunk[L] else (L, pos)


@dataclass(frozen=True)
class SkipRun:
    """One skip run: batch copy c skips occurrence ``sources[c]``, in a forward at ``top`` (with the Coda
    readouts of the smaller L of ``members``) or, with ``coda_of`` = L, in the Coda readout at L alone.
    ``members[L]``: the sources whose responses L counts."""

    sources: list[int]
    members: dict[int, list[int]]
    top: int
    coda_of: int | None = None


def _groups(sources: list[int], size: int) -> list[list[int]]:
    return [sources[start:start + size] for start in range(0, len(sources), size)]


def one_pass_runs(occ: _Occurrences, sources: dict[int, list[int]], skip_batch: int) -> list[SkipRun]:
    """The skip runs of a one-pass chunk: the prelude and loop occurrences any L skips, ``skip_batch`` per
    forward at the largest L that skips one of them (the smaller L read their Coda out of it); then each
    L's Coda occurrences, ``skip_batch`` per Coda readout at L on the normal x^(L)."""
    counted = {L: set(sources[L]) for L in occ.loops}
    need: dict[int, int] = {}  # occurrence -> the largest L that skips it
    for L in occ.loops:
        for i in sources[L]:
            if i <= occ.trunk[L]:
                need[i] = max(need.get(i, 0), L)
    runs = []
    for group in _groups(sorted(need), skip_batch):
        top = max(need[i] for i in group)
        members = {L: [i for i in group if i in counted[L] and i <= occ.trunk[L]] for L in occ.loops if L <= top}
        runs.append(SkipRun(group, {L: m for L, m in members.items() if m}, top))
    for L in occ.loops:
        runs += [SkipRun(group, {L: group}, L, coda_of=L)
                 for group in _groups([i for i in sources[L] if i > occ.trunk[L]], skip_batch)]
    return runs


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

    # ------------------------------------------------------------------ terms
    @staticmethod
    def _block_terms(targets: list[_Sums], pos: int, h_in: torch.Tensor, h_out: torch.Tensor, mask: torch.Tensor,
                     last: torch.Tensor) -> torch.Tensor:
        """Adds occurrence ``pos``'s block terms to each of ``targets``; returns its update u over T."""
        i = pos - 1
        a_in, a_out = _at_last(h_in.transpose(0, 1), last), _at_last(h_out.transpose(0, 1), last)
        angle = metrics.angular_distance(a_in, a_out)
        t_in, t_out = _selected(h_in, mask), _selected(h_out, mask)
        u = t_out - t_in
        terms = (angle.sum(), angle.square().sum(), metrics.relative_update(a_in, a_out).sum(),
                 metrics.token_variance(t_in).sum(), metrics.token_variance(t_out).sum(),
                 u.double().norm(dim=-1).sum())
        for sums in targets:
            for total, term in zip((sums.block_angle, sums.block_angle_sq, sums.block_update, sums.input_variance,
                                    sums.output_variance, sums.update_norm), terms):
                total[i] += term
        return u

    @staticmethod
    def _loop_terms(targets: dict[int, _Sums], trajectory: list[torch.Tensor], mask: torch.Tensor,
                    last: torch.Tensor) -> None:
        """Adds the loop terms of x^(0..L) to the sums of every L of ``targets`` (x^(0..L) is a prefix
        of ``trajectory``), and counts the chunk's sequences and tokens."""
        states = [_at_last(x, last) for x in trajectory]
        for t in range(len(trajectory) - 1):
            angle = metrics.angular_distance(states[t], states[t + 1])
            update = metrics.relative_update(states[t], states[t + 1])
            terms = (angle.sum(), update.sum(), angle.square().sum(), update.square().sum())
            for sums in (s for L, s in targets.items() if t < L):
                for total, term in zip((sums.loop_angle, sums.loop_update, sums.loop_angle_sq, sums.loop_update_sq),
                                       terms):
                    total[t] += term
        for t, x in enumerate(trajectory):
            variance = metrics.token_variance(x[mask].float())
            terms = (variance.sum(), variance.square().sum())
            for sums in (s for L, s in targets.items() if t <= L):
                sums.state_variance[t] += terms[0]
                sums.state_variance_sq[t] += terms[1]
        for sums in targets.values():
            sums.sequences += int(mask.shape[0])
            sums.tokens += int(mask.sum())

    # ------------------------------------------------------------------ passes
    def _coda_readout(self, hooks: OccurrenceHooks, occ: _Occurrences, L: int, h: torch.Tensor,
                      coda_args: tuple | None) -> None:
        """The Coda at L on the state x^(L) ``h`` [s, b, d] (what it reads of it: ``LoopLM.coda_input``), as
        occurrences a + s L + 1 .. D of L."""
        if not hooks.coda:  # no Coda: x^(L) is the output at L
            return
        occ.readout = L
        try:
            hooks.run_coda(self.model.coda_input(h), occ.trunk[L], coda_args)
        finally:
            occ.readout = None

    def _normal_pass(self, sums: dict[int, _Sums], occ: _Occurrences, tokens: torch.Tensor, mask: torch.Tensor,
                     keep_updates: bool) -> tuple[dict, list[torch.Tensor], tuple | None]:
        """The forward at the largest L of ``occ`` and the Coda readouts of the smaller ones: every block and
        loop term of each L. Returns the updates u over T (``_Occurrences.key``), the trajectory x^(0..L)
        [b, s, d] and the Coda's call arguments."""
        last = last_positions(mask)
        updates: dict = {}
        coda_in: list[torch.Tensor] = []  # the Coda's input in the forward at the largest L

        def record(pos: int, h_in: torch.Tensor, h_out: torch.Tensor) -> None:
            owners = occ.owners(pos)
            u = self._block_terms([sums[L] for L in owners], pos, h_in, h_out, mask, last)
            if keep_updates:
                updates[occ.key(owners[0], pos)] = u
            if occ.readout is None and pos == occ.trunk[occ.top] + 1:
                coda_in.append(h_in)
            return None

        hooks = OccurrenceHooks(self.model, record)
        occ.top = occ.loops[-1]
        with hooks:
            out = self.model(tokens[:, :-1], num_loops=occ.top, return_trajectory=True, compute_logits=False)
            if hooks.position != occ.layouts[occ.top].depth:
                raise LoopConfigError(f"saw {hooks.position} block occurrences, expected "
                                      f"D={occ.layouts[occ.top].depth}")
            # The Coda readouts assume the forward's Coda reads coda_input(x^(L)); a model that feeds it
            # anything else would give wrong numbers at the smaller L: refused, not approximated.
            if len(occ.loops) > 1 and coda_in and not torch.equal(
                    coda_in[0], self.model.coda_input(out.trajectory[occ.top].transpose(0, 1))):
                raise LoopConfigError(f"one-pass probe sweep: the Coda's input at r = {occ.top} is not "
                                      "LoopLM.coda_input(h^r); run one pass per r (--per-r)")
            for L in occ.loops[:-1]:
                self._coda_readout(hooks, occ, L, out.trajectory[L].transpose(0, 1), hooks.coda_args)
        self._loop_terms(sums, out.trajectory, mask, last)
        return updates, out.trajectory, hooks.coda_args

    def _skip_pass(self, sums: dict[int, _Sums], occ: _Occurrences, tokens: torch.Tensor, mask: torch.Tensor,
                   run: SkipRun, updates: dict, readout_state: torch.Tensor | None = None,
                   coda_args: tuple | None = None) -> None:
        """One skip run (batch copy c skips ``run.sources[c]``): a forward at ``run.top`` with the Coda
        readouts of the smaller L it serves, or, for ``run.coda_of`` = L, the Coda readout at L on the
        normal ``readout_state`` x^(L). Each L adds the changes of the sources it counts (``run.members``)."""
        sources = run.sources
        k, b = len(sources), tokens.shape[0]
        source_pos = torch.tensor(sources, device=self.device)
        source_of_row = source_pos.repeat_interleave(b)  # batch copy c (rows c*b .. c*b+b-1) skips sources[c]
        first, skip_set = min(sources), set(sources)
        rows = {L: torch.tensor([c for c, i in enumerate(sources) if i in set(counted)], device=self.device)
                for L, counted in run.members.items()}

        def skip_and_compare(pos: int, h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor | None:
            if occ.readout == run.coda_of and pos in skip_set:  # this occurrence's output becomes its input
                h_out = torch.where((source_of_row == pos)[None, :, None], h_in, h_out)
            owners = [L for L in occ.owners(pos) if L in rows] if pos > first else []
            if owners:  # target j = pos; only sources i < j form pairs
                u = (h_out - h_in).transpose(0, 1).reshape(k, b, *h_in.shape[::2])[:, mask].float()
                change = metrics.update_change_norm(u, updates[occ.key(owners[0], pos)].unsqueeze(0)).sum(dim=1)
                for L in owners:
                    counted = source_pos[rows[L]]
                    sums[L].response[counted - 1, pos - 1] += torch.where(counted < pos, change[rows[L]], 0.0)
            return h_out

        hooks = OccurrenceHooks(self.model, skip_and_compare)
        with hooks:
            if run.coda_of is not None:
                self._coda_readout(hooks, occ, run.coda_of, readout_state.repeat(1, k, 1), coda_args)
                return
            occ.top = run.top
            smaller = sorted(L for L in rows if L < run.top) if hooks.coda else []  # no Coda: nothing to read out
            out = self.model(tokens[:, :-1].repeat(k, 1), num_loops=run.top, return_trajectory=bool(smaller),
                             compute_logits=False)
            for L in smaller:
                self._coda_readout(hooks, occ, L, out.trajectory[L].transpose(0, 1), hooks.coda_args)

    # ------------------------------------------------------------------ driver
    def run(self, on_passes: Callable[[SweepPasses], None] | None = None) -> dict:
        """Every metric at every loop count; ``on_passes`` is told first whether one pass serves every L."""
        loops = sorted({int(L) for L in self.settings.loops})
        reference_added = min(loops) < self.train_loops and self.train_loops not in loops
        if reference_added:  # V~ of under-unrolled runs is normalised by the L_tr run's V(x^{L_tr})
            loops = sorted(loops + [self.train_loops])
        layouts = {L: layout_of(self.model, L) for L in loops}
        sources = {L: [] if reference_added and L == self.train_loops  # the added run only gives V(x^{L_tr})
                   else resolve_sources(self.settings.sources, layouts[L], self.train_loops) for L in loops}
        passes = probe_passes(self.model, loops, self.settings.one_pass)
        if on_passes is not None:
            on_passes(passes)
        if passes.one_pass:
            occ = _Occurrences(layouts)
            plans = [(occ, one_pass_runs(occ, sources, self.settings.skip_batch))]
        else:
            plans = [(_Occurrences({L: layouts[L]}), [SkipRun(group, {L: group}, L)
                                                      for group in _groups(sources[L], self.settings.skip_batch)])
                     for L in loops]
        chunks = -(-self.sample.num_sequences // self.settings.batch_size)
        bar = tqdm(total=chunks * sum(1 + len(runs) for _, runs in plans), desc="geometry probe", unit="pass",
                   disable=not self.settings.progress)
        sums = {L: _Sums(layouts[L].depth, L, self.device) for L in loops}
        with torch.inference_mode():
            for tokens, mask in self.sample.chunks(self.settings.batch_size):
                tokens, mask = tokens.to(self.device), mask.to(self.device)
                for occ, runs in plans:
                    updates, trajectory, coda_args = self._normal_pass(
                        {L: sums[L] for L in occ.loops}, occ, tokens, mask, keep_updates=bool(runs))
                    bar.update(1)
                    for run in runs:
                        state = None if run.coda_of is None else trajectory[run.coda_of].transpose(0, 1)
                        self._skip_pass(sums, occ, tokens, mask, run, updates, state, coda_args)
                        bar.update(1)
                    del updates, trajectory
        bar.close()
        results = {L: summarize(sums[L], layouts[L], self.train_loops, sources[L]) for L in loops}
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
            "sweep_passes": passes.record(),
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

"""Geometry probes of recurrent dynamics (paper App. C.4 "Geometry Probing").

    from megatron_loop.probes import ProbeSettings, load_probe_sample, probe_geometry
    sample = load_probe_sample(prefix, seq_length=2048, num_sequences=49, num_positions=100_000)
    report = probe_geometry(model, sample, ProbeSettings(loops=[7, 14, 21]), output_dir="probe/")

Modules: ``metrics`` (pure metric functions), ``positions`` (effective positions), ``sampling``
(examples and selection masks), ``hooks`` (block-occurrence hooks), ``runner`` (passes and
reduction), ``summaries`` (C_D and comparisons), ``plots`` (figures), ``report`` (entry point), ``cli``.
"""

from megatron_loop.probes.report import probe_geometry
from megatron_loop.probes.runner import GeometryProbe, ProbeSettings
from megatron_loop.probes.sampling import ProbeSample, load_probe_sample, select_positions

__all__ = ["GeometryProbe", "ProbeSample", "ProbeSettings", "load_probe_sample", "probe_geometry",
           "select_positions"]

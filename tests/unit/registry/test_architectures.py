"""``registry/architectures.py``: a run's name, kind, layout, conditioning fields and App. C.1's extra
parameter counts, exact (every run built with the paper's count: tests/unit/registry/test_registry.py)."""

from __future__ import annotations

from megatron_loop.registry.architectures import NO_CONDITIONING, Conditioning, baseloop_layout, make_run


def test_conditioning_names_fields_and_mechanisms():
    c = Conditioning(initial="channel", history="channel", window=2, timestep="loop_gating")
    assert c.suffix == "init_channel+hist_channel_w2+lg"
    assert c.label == "I(channel)+H(channel, w=2)+LG"
    assert c.mechanisms == ("initial", "history", "timestep")
    assert c.model_fields() == {"initial_injection": "channel", "history_injection": "channel", "history_window": 2,
                                "timestep": "loop_gating"}
    noisy = Conditioning(initial="scalar", init_noise=0.03)
    assert noisy.suffix == "init_scalar+noise" and noisy.model_fields() == {"initial_injection": "scalar",
                                                                            "injection_init_noise": 0.03}
    assert NO_CONDITIONING.suffix == "" and NO_CONDITIONING.mechanisms == () and NO_CONDITIONING.model_fields() == {}


def test_paper_parameter_counts_of_app_c1():
    d, s = 1024, 4
    assert Conditioning(initial="scalar").paper_parameters(d, s) == 1
    assert Conditioning(initial="residual_channel").paper_parameters(d, s) == 2 * d
    assert Conditioning(initial="dense").paper_parameters(d, s) == 2 * d * d
    assert Conditioning(history="dense", window=4).paper_parameters(d, s) == 4 * d * d
    assert Conditioning(timestep="branch_gating").paper_parameters(d, s) == 16 * s
    assert Conditioning(timestep="adaln").paper_parameters(d, s) == 32 * s * d
    assert Conditioning(initial="channel", history="scalar", window=2,
                        timestep="loop_gating").paper_parameters(d, s) == 2 * d + 2 + 8


def test_make_run_names_kinds_and_paper_counts():
    base = make_run("qwen", baseloop_layout("qwen", 4))
    assert (base.name, base.kind, base.layout, base.effective_depth, base.physical_depth) == \
        ("qwen_4x7", "BaseLoop", "4x7", 28, 4)
    assert (base.paper_params, base.paper_params_source) == (218_507_264, "Table 2")
    core = make_run("llama", (1, 2, 9, 1), Conditioning(timestep="adaln"))
    assert (core.name, core.kind, core.layout) == ("llama_1+2x9+1_adaln", "CoreLoop", "1+2x9+1")
    assert core.paper_params == 516_699_648  # physical depth 4
    assert core.describe() == "Llama3.1-1B CoreLoop 1+2x9+1 + AdaLN"
    pilot = make_run("qwen", (0, 4, 7, 0), train=(("optimizer", "adamw"),), name="pilot_x")
    assert pilot.paper_params is None and pilot.name == "pilot_x"  # its own recipe: no paper count
    assert make_run("llama", (0, 20, 1, 0)).kind == "NonLoop"

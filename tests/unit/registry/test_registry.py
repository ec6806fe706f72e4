"""The registry of the paper's runs: every run builds with the paper's parameter count, the
configs under examples/ are generated from it and current (their folders and index:
test_example_files.py), every run the paper trains is covered, studies and their CPU twins resolve, and
``pretrain_loop.py --list-configs`` prints every run."""

from __future__ import annotations

import collections

import pytest

from data_fixtures import REPO
from testpaths import load_script
from megatron_loop import build_model, registry
from megatron_loop.config import BACKBONES, build_model_config, load_config
from megatron_loop.model import roles


generate_configs = load_script("tools/generate_configs.py")


def test_examples_are_generated_from_the_registry_and_current():
    """A stale file, a registry run without its file, or a paper-config file the registry does
    not know all fail (``tools/generate_configs.py --check``)."""
    assert generate_configs.problems() == []
    assert len(generate_configs.expected_files()) == len(registry.RUNS) + 1  # and the index


def test_check_reports_stale_missing_and_unknown(tmp_path, monkeypatch):
    """Under examples/paper/ every file is the registry's; at the top of examples/ every YAML but
    the hand-written tiny_* ones. A config left at its old flat path is unknown there, missing
    at its folder."""
    examples = tmp_path / "examples"
    (examples / "paper" / "qwen" / "layouts").mkdir(parents=True)
    (examples / "llama_4x5.yaml").write_text(registry.render_run(registry.RUNS["llama_4x5"]))
    (examples / "qwen_4x7.yaml").write_text("model: {}\n")
    (examples / "llama_2x10.yaml").write_text(registry.render_run(registry.RUNS["llama_2x10"]))  # the old place
    (examples / "paper" / "qwen" / "layouts" / "qwen_9x9.yaml").write_text("model: {}\n")
    (examples / "paper" / "notes.txt").write_text("by hand\n")
    (examples / "tiny_2x3.yaml").write_text("model: {}\n")  # CPU configs are not the registry's
    (examples / "hostfile").write_text("localhost slots=8\n")
    monkeypatch.setattr(generate_configs, "ROOT", tmp_path)
    monkeypatch.setattr(generate_configs, "EXAMPLES", examples)
    monkeypatch.setattr(generate_configs, "PAPER_EXAMPLES", examples / "paper")
    found = generate_configs.problems()
    assert "examples/qwen_4x7.yaml: stale" in found
    assert "examples/llama_2x10.yaml: not in the registry" in found
    assert "examples/paper/llama/layouts/llama_2x10.yaml: missing" in found
    assert "examples/paper/qwen/layouts/qwen_9x9.yaml: not in the registry" in found
    assert "examples/paper/notes.txt: not in the registry" in found
    assert "examples/paper/README.md: missing" in found
    assert not any("llama_4x5.yaml" in p or "tiny_2x3" in p or "hostfile" in p for p in found)
    assert len(found) == (len(registry.RUNS) - 2 + 1) + 1 + 3


def test_every_run_builds_with_the_papers_parameter_count():
    """Meta-device build of all runs: the backbone count equals the paper's (Tables 1-2 exactly,
    App. C.1's rounded Qwen counts to their 0.01M), the conditioning count equals App. C.1's
    formula exactly, and the depths match the family's L(K)."""
    with_paper = 0
    for run in registry.RUNS.values():
        total, backbone = registry.parameter_counts(run.model_fields())
        # Ouro's exit gate (pilot_ouro_3x4_*): w [1, d] and b [1] beyond the paper's conditioning
        gate = (build_model_config(run.model_fields()).hidden_size + 1
                if dict(run.model).get("exit_gate") == "learned" else 0)
        assert total - backbone == run.paper_conditioning_parameters() + gate, run.name
        if run.paper_params is not None:
            with_paper += 1
            assert abs(backbone - run.paper_params) * 2 <= run.paper_params_precision, (run.name, backbone)
        if not run.train:  # the optimizer pilot has its own depths (App. D.1)
            assert run.effective_depth == run.recipe.effective_depth, run.name
    assert with_paper == len(registry.RUNS) - 12  # all but the pilot
    # the count is the built model's, not a formula: spot-check one run against a real build
    model = build_model(build_model_config(registry.RUNS["qwen_4x7_hist_dense_w2+lg"].model_fields()),
                        device="meta")
    assert registry.parameter_counts(registry.RUNS["qwen_4x7_hist_dense_w2+lg"].model_fields()) == (
        model.num_parameters(), model.num_parameters(backbone_only=True))
    assert any(roles.is_conditioning_matrix(p) for p in model.parameters())


def test_registry_covers_every_run_the_paper_trains():
    runs = list(registry.RUNS.values())
    paper = [r for r in runs if not r.train]

    def count(**want):
        return sum(all(getattr(r.conditioning, k, None) == v if hasattr(r.conditioning, k) else getattr(r, k) == v
                       for k, v in want.items()) for r in paper)

    none = registry.Conditioning()
    kinds = collections.Counter((r.family, r.kind) for r in paper if r.conditioning == none)
    assert kinds == {("llama", "NonLoop"): 1, ("llama", "BaseLoop"): 4, ("llama", "CoreLoop"): 14,
                     ("qwen", "NonLoop"): 1, ("qwen", "BaseLoop"): 4, ("qwen", "CoreLoop"): 3}
    for fam in ("llama", "qwen"):  # initial x 4 and LG / BG / AdaLN for every BaseLoop
        for kind in registry.INITIAL:
            assert count(family=fam, kind="BaseLoop", initial=kind, history="none", timestep="none",
                         init_noise=0.0) == 4
        for kind in registry.TIMESTEP:
            assert count(family=fam, kind="BaseLoop", timestep=kind, initial="none", history="none") == 4
    for kind in ("scalar", "channel", "dense"):  # history x w in {1, 2, 4}
        assert {r.conditioning.window for r in paper if r.conditioning == registry.Conditioning(
            history=kind, window=r.conditioning.window)} == {1, 2, 4}
    combos = {r.conditioning.label for r in paper if r.layout == "4x7" and r.family == "qwen"}
    for label in ("I(channel)+H(channel, w=2)", "I(channel)+LG", "I(channel)+BG", "H(channel, w=2)+LG",
                  "H(channel, w=2)+BG", "I(channel)+H(channel, w=2)+LG", "I(channel)+H(channel, w=2)+BG",
                  "I(dense)+LG", "I(dense)+BG", "H(dense, w=1)+LG", "H(channel, w=4)+LG",
                  "I(scalar)+H(scalar, w=4)", "I(dense)+H(dense, w=1)", "I(channel, noise 0.03)"):
        assert label in combos, label
    pilot = [r for r in runs if r.train]
    assert collections.Counter(dict(r.train)["optimizer"] for r in pilot) == {"adamw": 6, "muon_adamw": 6}
    # Table 7's six architectures; Ouro is BaseLoop 3x4 with its learned exit gate and Stage I objective
    assert {r.name.rsplit("_", 1)[0] for r in pilot} == {f"pilot_{a}" for a in (
        "nonloop_12x1", "nonloop_3x1", "baseloop_3x4", "loopformer_3x4", "ouro_3x4", "huginn_1+2x5+1")}
    ouro = registry.RUNS["pilot_ouro_3x4_muon"]
    assert ouro.model_fields() == {**registry.RUNS["pilot_baseloop_3x4_muon"].model_fields(), "exit_gate": "learned"}
    assert dict(ouro.train)["exit_gate_objective"] == "entropy_regularized"
    assert "exit gate" in ouro.note and "App. D.1" in ouro.note and "stand" not in ouro.note


def test_studies_resolve_and_cover_every_run():
    in_a_study = {name for s in registry.STUDY_LIST for name in s.runs}
    assert in_a_study == set(registry.RUNS)
    assert all(name in registry.RUNS for s in registry.STUDY_LIST for name in s.runs)
    refs = {ref for name in registry.RUNS for ref in registry.paper_refs(name)}
    assert {f"Fig. {i}" for i in range(1, 24)} <= refs
    assert {f"Table {i}" for i in (1, 2, 7, 8, 9, 10, 11, 12)} <= refs
    assert registry.paper_refs("llama_2x10_lg") == []  # not in the paper (study ext_llama_timestep)


def test_toy_twins_load_with_the_execution_settings(tmp_path):
    plan = generate_configs.write_toys(registry.STUDIES["toy"], str(tmp_path))
    names = [line.split("\t")[0] for line in plan]
    assert names == ["nonloop_6x1", "baseloop_2x3", "coreloop_0+1x5+1", "baseloop_2x3_hist_lg"]
    hist_lg = load_config(tmp_path / "configs" / "baseloop_2x3_hist_lg.yaml")
    m = hist_lg.model
    assert (m.backbone, m.layout, m.history_injection, m.history_window, m.timestep) == (
        "tiny-llama", "0+2x3+0", "channel", 2, "loop_gating")
    assert hist_lg.train.micro_batch_size == registry.EXECUTION["toy"]["micro_batch_size"]
    assert hist_lg.data.train_prefixes == [f"{tmp_path}/data/corpus"]
    assert plan[-1].split("\t")[2:] == ["1,2,3,4,5,6", "-"]
    # default twins: the run's own layout and conditioning at tiny width; probes for geometry figures
    plan = generate_configs.write_toys(registry.STUDIES["fig3"], str(tmp_path / "fig3"))
    for line in plan:
        name, path, loops, probe = line.split("\t")
        run = registry.RUNS[name.removeprefix("toy_")]
        cfg = load_config(path)
        assert cfg.model.backbone == "tiny-llama"
        assert cfg.model.layout == f"{run.prelude}+{run.core}x{run.loops}+{run.coda}"
        last = int(loops.split(",")[-1])  # the first r reaching 2 L(K) (19 for 2x9 CoreLoops, not 2K = 18)
        assert run.prelude + last * run.core + run.coda >= 2 * run.effective_depth > (
            run.prelude + (last - 1) * run.core + run.coda) and probe != "-"


def test_study_commands_and_cli_errors(capsys):
    lines = generate_configs.study_commands(registry.STUDIES["fig7"])
    trains = [line for line in lines if line.startswith("deepspeed pretrain_loop.py")]
    assert trains == [f"deepspeed pretrain_loop.py --config {registry.example_path(n)}"
                      for n in registry.STUDIES["fig7"].runs]
    assert all((REPO / line.split("--config ")[1]).is_file() for line in trains)
    evals = [line for line in lines if "eval_loops.py" in line]
    assert "--loops 1,2,3," in evals[0] and evals[0].split("--loops ")[1].split()[0].endswith(",21")  # 3 x K
    assert evals[-1].count("--compare") == len(trains) - 1
    assert generate_configs.main(["--study", "nope", "--commands"]) == 2
    assert "unknown study" in capsys.readouterr().err
    assert generate_configs.main(["--study", "table2", "--toy-dir", "x"]) == 2


def test_list_configs_cli_prints_every_run(monkeypatch, capsys):
    """Counts go through registry.parameter_counts (checked above); here the CLI wiring and table."""
    pretrain_loop = load_script("pretrain_loop.py")
    seen = []
    monkeypatch.setattr(registry.listing, "parameter_counts", lambda fields: seen.append(fields) or (1234567, 1))
    assert pretrain_loop.main(["--list-configs", "--details"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(seen) == len(registry.RUNS) and len(out) == len(registry.RUNS) + 5
    assert "examples/qwen_4x7.yaml" in out[-2] and "examples/paper/README.md" in out[-2]
    row = next(line for line in out if line.startswith("qwen_4x7_hist_channel_w2+lg "))
    for cell in ("Qwen3-0.6B", "BaseLoop", "0+4x7+0", "H(channel, w=2)+LG", "1,234,567", "Fig. 7", "Fig. 20",
                 "r 1-21 (D 28 @ r 7, 56 @ r 14, 84 @ r 21)"):
        assert cell in row, cell
    # the depths each run is evaluated at; the pilot's assumed recipe marked as such
    assert "r 1-19 (D 20 @ r 9, 40 @ r 19)" in next(line for line in out if line.startswith("llama_0+2x9+2 "))
    pilots = [line for line in out if line.startswith("pilot_")]
    assert len(pilots) == 12 and all("Table 7 (assumed recipe*)" in line for line in pilots)
    footnote = next(line for line in out if line.startswith("* optimizer pilot"))
    for key in ("model.backbone", "train.lr", "train.global_batch_size", "train.seq_length", "budget"):
        assert key in footnote, key
    assert pretrain_loop.main([]) == 2
    seen.clear()
    assert pretrain_loop.main(["--list-configs"]) == 0 and not seen  # names and files only: nothing counted


@pytest.mark.parametrize("name", ["llama_4x5", "qwen_4x7", "qwen_4x7_init_channel+hist_channel_w2+lg"])
def test_existing_names_keep_working(name):
    cfg = load_config(REPO / registry.example_path(name))
    assert cfg.model.backbone in BACKBONES and cfg.train.seq_length == 2048


def _loops_of(line: str, flag: str) -> list[int]:
    return [int(r) for r in line.split(f"{flag} ")[1].split()[0].split(",")]


def test_every_sweep_reaches_each_depth_its_figure_plots():
    """Sec. 2.2 (iii): every comparison is at matched inference depth. For every run of every
    study, the generated loop sweep (and, for geometry figures, the probe loops) contain the
    first r whose L(r) = p + r·s + c reaches each depth the figure compares at: L(K) and its
    multiples up to the study's (2x; 3x for Sec. 6 / App. D.6; Fig. 8 Llama at D = 40)."""
    checked = 0
    for study in registry.STUDY_LIST:
        if study.params_only or study.toy_runs:
            continue
        lines = generate_configs.study_commands(study)
        for name in study.runs:
            run = registry.RUNS[name]
            p, s, k, c = run.layout_tuple
            sweep = _loops_of(next(line for line in lines if f"--model hf/{name} " in line), "--loops")
            probe = ([_loops_of(line, "--loops") for line in lines if f"--checkpoint runs/{name}/" in line
                      and "probe_geometry" in line] or [None])[0]
            multiple = study.multiple_for(run.family) if k > 1 else 1
            depths = [j * run.effective_depth for j in range(1, multiple + 1)]
            assert max(p + r * s + c for r in sweep) >= depths[-1], (study.name, name)
            for depth in depths:
                first = next(r for r in range(1, 10 * depth) if p + r * s + c >= depth)
                assert first in sweep, (study.name, name, depth, sweep)
                assert probe is None or first in probe, (study.name, name, depth, probe)
                checked += 1
    assert checked > 400
    # matched effective depth, worked examples: x+2x9+y reaches D = 40 at r = 19, the Qwen 2x13 CoreLoops D = 56 at r = 27,
    # Fig. 8(a) probes the Llama 2x9 CoreLoops at D = 40 and does not sweep Llama to 3x
    fig2 = generate_configs.study_commands(registry.STUDIES["fig2"])
    assert _loops_of(next(x for x in fig2 if "--model hf/llama_1+2x9+1 " in x), "--loops")[-1] == 19
    assert _loops_of(next(x for x in fig2 if "--model hf/llama_0+3x6+2 " in x), "--loops")[-1] == 13  # L = 41
    fig9 = generate_configs.study_commands(registry.STUDIES["fig9"])
    assert _loops_of(next(x for x in fig9 if "--model hf/qwen_2+2x13+0 " in x), "--loops")[-1] == 27
    fig8 = generate_configs.study_commands(registry.STUDIES["fig8"])
    assert _loops_of(next(x for x in fig8 if "probe_geometry" in x and "llama_0+2x9+2/" in x), "--loops") == [1, 4, 9, 19]
    assert _loops_of(next(x for x in fig8 if "--model hf/qwen_4x7_init_dense " in x), "--loops")[-1] == 21
    # the toy twins too: the CoreLoop 0+1x5+1 reaches 2 L(K) = 12 at r = 11
    assert registry.sweep_loops((0, 1, 5, 1), 2)[-1] == 11
    assert registry.probe_loops((0, 3, 6, 2), 2) == [1, 3, 6, 13]


def test_docs_show_the_depths_each_layout_is_evaluated_at():
    table = generate_configs.reproduce_table()
    assert "| Llama3.1-1B | CoreLoop | 0+2x9+2 | r 1-19 (D 20 @ r 9, 40 @ r 19) |" in table
    assert "| Qwen3-0.6B | CoreLoop | 1+2x13+1 | r 1-27 (D 28 @ r 13, 56 @ r 27) |" in table
    assert "| Llama3.1-1B | CoreLoop | 2+3x6+0 | r 1-13 (D 20 @ r 6, 40 @ r 13 (L = 41)) |" in table


def test_paper_configs_use_the_papers_data_order(tmp_path):
    """App. C.1: the preprocessing stream (10,000-document buffer, seed 42) is the training order:
    ``data.order: stream``, the default; the toy twins re-permute the generated corpus per epoch."""
    from megatron_loop.config import DataConfig

    assert DataConfig().order == "stream"
    for name in registry.RUNS:
        assert load_config(REPO / registry.example_path(name)).data.order == "stream", name
    assert "data.order: stream" not in (REPO / "examples" / "llama_4x5.yaml").read_text()  # a section key
    assert "  order: stream  # App. C.1" in (REPO / "examples" / "llama_4x5.yaml").read_text()
    generate_configs.write_toys(registry.STUDIES["toy"], str(tmp_path))
    assert load_config(tmp_path / "configs" / "baseloop_2x3.yaml").data.order == "shuffled"
    for tiny in sorted((REPO / "examples").glob("tiny_*.yaml")):
        assert load_config(tiny).data.order == "shuffled", tiny.name
    reference = (REPO / "docs" / "CONFIG.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `order` |"))
    assert "`'stream'`" in row and "10,000-document" in row and "`shuffled`" in row


def test_table_refs_follow_the_papers_tables():
    """Fig. 5 shows the NonLoop reference, Table 10 has no NonLoop row."""
    assert registry.paper_refs("qwen_28x1") == ["Fig. 4", "Fig. 5", "Fig. 6", "Table 1", "Table 9", "Table 12"]
    assert "Table 10" in registry.paper_refs("qwen_4x7_hist_dense_w2")


def test_seeded_study_twins(tmp_path, capsys):
    """finding1: every twin once per seed (seed-major), its own lr/steps/micro-batch, and the
    corpus flags and tasks tools/small_study.sh reads (--toy-env)."""
    study = registry.STUDIES["finding1"]
    plan = generate_configs.write_toys(study, str(tmp_path))
    names = [line.split("\t")[0] for line in plan]
    assert names[:3] == ["nonloop_2x1-seed1", "baseloop_2x3-seed1", "nonloop_6x1-seed1"] and len(names) == 9
    cfg = load_config(tmp_path / "configs" / "baseloop_2x3-seed3.yaml")
    assert (cfg.model.layout, cfg.train.seed, cfg.train.lr, cfg.train.max_steps, cfg.train.micro_batch_size) == (
        "0+2x3+0", 3, 1.0e-2, 800, 16)
    assert cfg.train.output_dir == f"{tmp_path}/baseloop_2x3-seed3/train"
    assert plan[1].split("\t")[2:] == ["1,2,3,4,5,6", "-"] and plan[0].split("\t")[2] == "1"
    assert generate_configs.main(["--study", "finding1", "--toy-env"]) == 0
    env = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert env["STUDY_TASKS"] == "facts,clutrr=looplm_clutrr_local" and env["STUDY_SEEDS"] == "'1 2 3'"
    assert env["STUDY_DEFAULT_STEPS"] == "800" and "--reasoning-tasks clutrr" in env["STUDY_CORPUS_ARGS"]
    assert generate_configs.main(["--study", "toy", "--toy-env"]) == 0
    assert "STUDY_SEEDS=''" in capsys.readouterr().out


def test_every_study_lists_a_run_once_and_the_pilot_evaluates_its_own_suite():
    """A study's commands train each run once (Fig. 23 lists H+LG among the pairs, not again); the
    optimizer pilot (Table 7) sweeps App. D.1's ten benchmarks, not App. C.3's eleven."""
    for study in registry.STUDY_LIST:
        assert len(set(study.runs)) == len(study.runs), study.name
    with pytest.raises(ValueError, match="listed twice"):
        registry.Study("x", "", "x", ("llama_4x5", "llama_4x5"))
    lines = generate_configs.study_commands(registry.STUDIES["fig23"])
    assert sum(line.startswith("deepspeed pretrain_loop.py") for line in lines) == 7
    suite = "arc_easy,arc_challenge,sciq,mmlu,hellaswag,openbookqa,piqa,race,winogrande,commonsense_qa"
    evals = [line for line in generate_configs.study_commands(registry.STUDIES["table7"]) if "eval_loops.py" in line]
    assert len(evals) == 12 and all(f"--tasks {suite} " in line for line in evals)
    assert not any("--tasks" in line for line in generate_configs.study_commands(registry.STUDIES["fig2"]))
    from megatron_loop.eval.tasks import resolve_tasks

    specs = resolve_tasks(suite.split(","))
    assert [s.key for s in specs] == suite.split(",") and len(specs[3].lm_eval_tasks) == 57
    assert {s.key for s in specs if s.group == "extra"} == set()  # Overall = the mean of all ten (Table 7's Avg.)


def test_list_studies_counts_what_the_small_study_trains(capsys):
    """``--list-studies`` gives the paper's runs and the CPU runs a study trains: its twins once per seed
    (finding1: 2 paper runs but 3 models x 3 seeds), and says a parameter table trains nothing."""
    tool = load_script("tools/generate_configs.py")
    assert tool.main(["--list-studies"]) == 0
    rows = {line.split("\t")[0]: line.split("\t")[3] for line in capsys.readouterr().out.splitlines()}
    assert rows["finding1"] == "2 paper runs; on CPU 3 models x 3 seeds = 9 runs"
    assert rows["table7_designs"] == "4 paper runs; on CPU 4 models = 4 runs"
    assert rows["table1"] == "2 paper runs (a parameter table: nothing to train)"

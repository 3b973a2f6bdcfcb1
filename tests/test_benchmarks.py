"""The benchmark scripts' own logic (no fairchem, no timing): configs they train, tables they render."""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench_modules(monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    before = dict(os.environ)
    mods = importlib.import_module("study_accuracy"), importlib.import_module("summary")
    # importing a benchmark must not change the environment the rest of the suite (and its subprocesses) sees
    assert dict(os.environ) == before
    return mods


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("data", ["qm9", "emt"])
def test_study_configs_build_identical_shapes(bench_modules, data):
    """Every est variant of the accuracy study composes to a valid config and the same shape as the others."""
    study, _ = bench_modules
    from est.models import build_model
    from est.train import load_config

    d = study.DATASETS[data]
    counts = {}
    for model in study.MODELS:
        if any("_target_" in o for o in study.MODELS[model]) or data not in study.ONLY_ON.get(model, study.DATASETS):
            continue  # fairchem's model and est's twin of it are built in fairchem's environment
        cfg = load_config([f"+experiment={d['experiment']}", *d["overrides"], *study.model_overrides(model, data)])
        m = dict(cfg.model)
        m.update(avg_num_nodes=18.0, avg_degree=12.0)
        net = build_model(**m)
        counts[model] = sum(p.numel() for p in net.parameters())
        assert net.config.num_radial == 600 and net.config.grid_resolution[0] == net.config.grid_resolution[1]
    # est-ffn is exactly the shape fairchem is built at (comparable_config of the same overrides)
    fe = importlib.import_module("fairchem_eqv2")
    cfg = load_config([f"+experiment={d['experiment']}", *d["overrides"], *study.MODELS["est-ffn"]])
    m = {k: v for k, v in dict(cfg.model).items() if k != "name"}
    m.update(avg_num_nodes=18.0, avg_degree=12.0)
    assert fe.comparable_config(cfg.model.name, **m) == build_model(name=cfg.model.name, **m).config
    assert counts["est-ffn"] < counts["est-hybrid0"]  # the previous default: the FFN expert plus a spherical one
    if data == "emt":  # the previous default at L = 3 samples its transformer on a design of degree 3L = 9
        cfg = load_config([f"+experiment={d['experiment']}", *d["overrides"], *study.model_overrides("est-hybrid0", data)])
        assert cfg.model.est.grid.degree == 9 and cfg.model.est.projections == "points"


def _rec(model, seed, gap, t=100.0, eq=None):
    rec = {"model": model, "seed": seed, "params": 10, "steps": 5, "split": "test", "ms_per_step": t,
           "metrics": {"mae_gap": gap, "mae_U0": 2 * gap, "mae_mu": 0.1, "mae_alpha": 0.2,
                       "base_mae_gap": 1000.0, "base_mae_U0": 9.0, "base_mae_mu": 1.0, "base_mae_alpha": 3.0}}
    if eq is not None:
        rec["equivariance"] = {"output": "properties", "molecule": eq}
    return rec


def test_accuracy_tables_pair_seeds_and_ratios(bench_modules):
    _, summary = bench_modules
    runs = {"qm9": {
        "fairchem": [_rec("fairchem", 0, 100.0, 200.0, 1e-6), _rec("fairchem", 1, 120.0, 200.0, 2e-6)],
        "est-default": [_rec("est-default", 1, 60.0, 100.0, 1e-8), _rec("est-default", 0, 110.0, 100.0, 1e-8)],
        "est-t4": [_rec("est-t4", 0, 90.0)],
        "est-t14": [_rec("est-t14", 1, 66.0), _rec("est-t14", 0, 99.0)],
    }}
    t = summary.accuracy_tables({"runs": runs})
    main = t["accuracy-qm9"]
    # per-seed ratios are paired by seed, not by order: seed 1 -> 60/120, seed 0 -> 110/100
    assert "0.50 1.10 (1/2 lower)" in main
    assert "step time" not in main  # per-run step times on a shared machine are noise: not reported
    assert "85 ± 35" in main  # mean ± sd of 60 and 110
    assert "mean predictor" in main and "1000" in main
    assert "previous default, ST on t=4 (S=12)" in t["ablation-qm9"]
    # an ablation of one factor of the default: paired with the default's 3 seeds, not its seed-0 row
    t14 = next(x for x in t["ablation-qm9"].splitlines() if "degree-14" in x)
    assert "| 1.100 0.900; 1.000 (1/2 lower) |" in t14  # seed 1: 66 / 60, seed 0: 99 / 110
    assert "| 0.005 |" in t["accuracy-equivariance"]  # est 1e-8 / fairchem 2e-6
    only_ablations = summary.accuracy_tables({"runs": {"qm9": {"est-t4": runs["qm9"]["est-t4"]}}})
    assert "accuracy-qm9" not in only_ablations  # a run of ablation models alone renders without the main table


def test_merge_runs_keeps_other_models_and_seeds(bench_modules, monkeypatch, tmp_path):
    """A study called with a subset of models or seeds must not drop the stored others (it did, twice)."""
    import json

    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    stored = {"emt": {"fairchem": [{"seed": 0, "v": 1}, {"seed": 1, "v": 2}], "est-ffn": [{"seed": 0, "v": 3}]}}
    (tmp_path / "parity.json").write_text(json.dumps({"overrides": [], "runs": stored}))
    new = {"emt": {"est-ffn": [{"seed": 1, "v": 4}, {"seed": 0, "v": 5}]}, "qm9": {"fairchem": [{"seed": 3, "v": 6}]}}
    same = common.merge_runs("parity", new, compatible=lambda old: old["overrides"] == [])
    assert same["emt"]["fairchem"] == stored["emt"]["fairchem"]  # another model: kept
    assert [r["v"] for r in same["emt"]["est-ffn"]] == [5, 4]  # re-run seeds replace, sorted by seed
    assert same["qm9"] == new["qm9"]
    assert common.merge_runs("parity", new, compatible=lambda old: False) == new  # other options: nothing kept
    assert common.merge_runs("absent", new, compatible=lambda old: True) == new


def disk_fills_after_half(monkeypatch) -> None:
    """From here on, any file opened for writing takes half of its first write, then the disk is full."""
    import io

    real_open = io.open

    class HalfThenFail:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError("No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def failing_open(file, mode="r", *a, **k):  # Path.write_text and os.fdopen both open through io.open
        f = real_open(file, mode, *a, **k)
        return HalfThenFail(f) if any(c in mode for c in "wax") else f

    monkeypatch.setattr(io, "open", failing_open)


def test_results_file_is_never_left_half_written(bench_modules, monkeypatch, tmp_path):
    """A write killed part-way (here: the disk fills) leaves the previous results file whole: drivers on other
    cores read it back to merge their runs."""
    import json

    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.save("forces", {"runs": {"ethanol": {}}}, machine=False)
    disk_fills_after_half(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        common.save("forces", {"runs": {"ethanol": {"est-ffn": []}}}, machine=False)
    assert json.loads((tmp_path / "forces.json").read_text()) == {"runs": {"ethanol": {}}}
    assert [p.name for p in tmp_path.iterdir()] == ["forces.json"]  # no temporary file left


def test_a_runs_record_is_never_left_half_written(bench_modules, monkeypatch, tmp_path):
    """``result.json`` marks a run done (the drivers skip it and merge it): a write cut short leaves none, so
    the run is run again, and a whole one reads back as written."""
    common = importlib.import_module("common")
    rd = tmp_path / "ethanol" / "est-ffn-s0"
    rec = {"model": "est-ffn", "seed": 0, "run_dir": rd}
    common.write_result(rd, rec)
    job = ("ethanol", "est-ffn", 0)
    assert common.load_results([job], lambda j: rd) == {"ethanol": {"est-ffn": [rec | {"run_dir": str(rd)}]}}
    other = tmp_path / "ethanol" / "est-ffn-s1"
    disk_fills_after_half(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        common.write_result(other, rec)
    assert list(other.iterdir()) == []  # no result.json, no temporary file


def lock_is_held(common, path: Path) -> bool:
    """Whether a driver holds the lock of the results file ``path`` (tried without waiting)."""
    import fcntl

    with open(common.lock_file(path), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_two_drivers_ending_together_keep_both_runs(bench_modules, monkeypatch, tmp_path):
    """Each driver reads the results file, merges its runs and writes it under the file's lock: the second
    waits for the first's write instead of merging into the file as it was before (and dropping its runs)."""
    import threading
    import time

    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.results_file("forces")
    common.save("forces", {"runs": {}}, machine=False)
    first_has_read = threading.Event()

    def driver(seed: int, *, slow: bool) -> None:
        with common.locked(path):
            stored = common.load("forces")
            if slow:  # its tables and plots, while the other driver ends
                first_has_read.set()
                time.sleep(0.5)
            runs = common.merge_runs("forces", {"ethanol": {"est-ffn": [{"seed": seed}]}},
                                     compatible=lambda old: True, stored=stored)
            common.save("forces", {"runs": runs}, machine=False)

    first = threading.Thread(target=driver, args=(0,), kwargs=dict(slow=True))
    first.start()
    first_has_read.wait(timeout=10)
    assert lock_is_held(common, path)
    driver(1, slow=False)
    first.join()
    assert [r["seed"] for r in common.load("forces")["runs"]["ethanol"]["est-ffn"]] == [0, 1]
    assert not lock_is_held(common, path)


def test_accuracy_study_merges_and_writes_its_results_under_the_files_lock(bench_modules, monkeypatch, tmp_path):
    """The accuracy study's driver holds its results file's lock from its merge to its write, and lets go."""
    study, _ = bench_modules
    common = importlib.import_module("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("EST_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(study, "load_results", lambda *a: {"emt": {"est-ffn": [{"seed": 0}]}})
    monkeypatch.setattr(study, "tables", lambda results: {})
    saved = []

    def save(name, payload, **kw):
        saved.append((name, lock_is_held(common, common.results_file(name))))
        return common.results_file(name)

    monkeypatch.setattr(study, "save", save)
    assert study.main(["--tables-only", "--data", "emt", "--models", "est-ffn", "--seeds", "0", "--save-as", "acc",
                       "--root", str(tmp_path / "runs")]) == 0
    assert saved == [("acc", True)]
    assert not lock_is_held(common, common.results_file("acc"))


def test_interrupted_accuracy_run_writes_no_result(bench_modules, monkeypatch, tmp_path):
    """A run stopped by SIGTERM must exit non-zero without a result.json (one was recorded at 57 of 225 steps)."""
    import est.train

    study, _ = bench_modules

    class Stopped:  # the trainer as it returns after SIGTERM: last.pt saved, status "interrupted"
        step = 57

        def __init__(self, cfg):
            pass

        def fit(self):
            return "interrupted"

    monkeypatch.setattr(est.train, "Trainer", Stopped)
    monkeypatch.setattr(est.train, "load_config", lambda cli: None)
    with pytest.raises(SystemExit, match="interrupted at step 57"):
        study.main(["--one", "emt", "est-ffn", "4", "--root", str(tmp_path)])
    assert not list(tmp_path.rglob("result.json"))


def test_readme_blocks_replaced_only_by_name(bench_modules):
    _, summary = bench_modules
    text = "a\n<!-- summary:x -->\nold\n<!-- /summary:x -->\nb\n<!-- summary:y -->\nkeep\n<!-- /summary:y -->\n"
    new, done = summary.replace_blocks(text, {"x": "NEW"})
    assert done == ["x"]
    assert "NEW" in new and "old" not in new and "keep" in new


def test_fairchem_absent_is_a_clear_skip(bench_modules, monkeypatch):
    fe = importlib.import_module("fairchem_eqv2")
    monkeypatch.setattr(fe, "_fairchem_importable", lambda: False)
    assert not fe.available()
    assert "setup_fairchem.sh" in fe.unavailable_reason()
    with pytest.raises(RuntimeError, match="setup_fairchem.sh"):
        fe.trainable(name="eqv2-tiny")
    assert "fairchem" in sys.modules["study_accuracy"].MODELS


def test_cpu_shapes_have_fairchem_parameter_counts_exactly(bench_modules):
    """bench_vs_fairchem's tiny and small shapes, built as that script builds them (comparable_config),
    have exactly the parameter counts fairchem-core's EquiformerV2 had there (vs_fairchem.json), which
    docs/results.md quotes."""
    import json

    from est.models import EquiformerV2

    fe = importlib.import_module("fairchem_eqv2")
    vs = importlib.import_module("bench_vs_fairchem")
    rows = json.loads((BENCH / "results" / "vs_fairchem.json").read_text())["rows"]
    fairchem = {r["shape"]: round(r["params_M"] * 1e6) for r in rows if r.get("model") == "fairchem"}
    docs = (BENCH.parent / "docs" / "results.md").read_text()
    for shape in ("tiny", "small"):
        name, graph, _, _ = vs.SHAPES[shape]
        n = EquiformerV2(fe.comparable_config(name, **graph)).num_parameters()
        assert n == fairchem[shape], (shape, n, fairchem[shape])
        assert f"{n:,}" in docs, f"docs/results.md should quote {n:,} for the {shape} shape"


def test_torch_sim_bench_relaxes_the_same_minima(monkeypatch_module, tmp_path, capsys):
    """bench_torch_sim.py end to end on 2 molecules (random weights): both engines converge, energies agree."""
    pytest.importorskip("torch_sim")
    import json

    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_torch_sim")
    import torch

    out = tmp_path / "ts"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--structures", "2", "--max-steps", "50", "--save-as", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the script runs on one thread; the rest of the suite does not
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["converged"] for r in res["rows"]] == ["2/2", "2/2"]
    assert res["max_abs_de_per_atom_eV"] < 1e-4 and "random weights" in res["model"]
    assert "| torch-sim, one batch" in capsys.readouterr().out


def test_expressivity_separation_pass_resumes_and_renders(monkeypatch_module, monkeypatch, tmp_path):
    """The separation pass computes each cell once (a second pass reuses the file) and the tables show it."""
    monkeypatch_module.syspath_prepend(str(BENCH))
    study = importlib.import_module("study_expressivity")
    cells = [dict(task="counterexample", params=dict(body=2), model=m, lmax=1, layers=1) for m in ("e3nn TP", "eqv2 (ffn)")]
    path = tmp_path / "sep.json"
    sep = study.separation_pass(cells, 8, path)
    tp, ffn = (sep["cells"][study.key(c)] for c in cells)
    assert max(tp["per_seed"]) < 1e-14 and min(ffn["per_seed"]) > 1e-4  # one TFN layer: radial sums only
    assert len(ffn["per_seed"]) == len(ffn["floor_per_seed"]) == study.SEPARATION_SEEDS

    def fail(*a, **k):
        raise AssertionError("recomputed a cell that is in the file")

    monkeypatch.setattr(study, "cell_separation", fail)
    assert study.separation_pass(cells, 8, path) == sep
    with pytest.raises(SystemExit, match="channels"):
        study.separation_pass(cells, 16, path)
    data = dict(cells={}, equivariance={}, config=dict(counter_lmax=1))
    out = study.tables(data, echo=False, separation=sep)
    row = next(line for line in out["counterexample-separation"].splitlines() if line.startswith("| eqv2 (ffn)"))
    assert study.fmt_separation(ffn) in row and "; floor " in row


def test_expressivity_drivers_side_by_side_keep_each_others_runs(monkeypatch_module, tmp_path):
    """Two drivers (say one per --models) each hold the study in memory; every result is merged into the
    file under its lock, so neither overwrites the other's runs, and a seed already stored is kept."""
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    study = importlib.import_module("study_expressivity")
    path = tmp_path / "expr.json"
    a, b = (dict(task="counterexample", params=dict(body=2), model=m, lmax=4, layers=1) for m in ("e3nn TP", "eqv2 (ffn)"))
    stale = study.load(path)  # driver B read the file before driver A wrote anything
    study.update(path, lambda d: study.add_run(d, a, dict(seed=0, accuracy=50.0)))
    data = study.update(path, lambda d: study.add_run(d, b, dict(seed=0, accuracy=100.0)))
    assert stale == study.empty_study()
    assert [r["accuracy"] for r in data["cells"][study.key(a)]["runs"]] == [50.0]
    assert [r["accuracy"] for r in data["cells"][study.key(b)]["runs"]] == [100.0]
    data = study.update(path, lambda d: study.add_run(d, a, dict(seed=0, accuracy=100.0)))  # same seed again
    assert [r["accuracy"] for r in data["cells"][study.key(a)]["runs"]] == [50.0]
    assert study.load(path) == data


def test_expressivity_mace_row_invariant_tasks_only(monkeypatch_module):
    """MACE's one layer outputs scalars only: it gets the kchain and counterexample cells, never rotsym."""
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    study = importlib.import_module("study_expressivity")
    args = type("Args", (), dict(models=["MACE (correlation 3)", "e3nn TP"], kchain_k=4, kchain_lmax=2,
                                 counter_lmax=4, tasks=None))()
    cells = study.cells(args)
    mace = [c for c in cells if c["model"] == "MACE (correlation 3)"]
    assert {c["task"] for c in mace} == {"counterexample", "kchain"} and len(mace) == 3 + 5
    assert sum(c["task"] == "rotsym" for c in cells) == len(study.LMAXES) * len(study.FOLDS)  # the TP row's


@pytest.mark.skipif(not (BENCH / ".venv-mace" / "bin" / "python").exists(),
                    reason="MACE venv missing (bash benchmarks/baseline/setup_mace.sh)")
def test_mace_expressivity_separation_in_its_venv(monkeypatch_module):
    """MACE through est's separation measure, in its own venv: one layer of correlation 3 separates the
    two-body counterexample (angles enter in one layer) and is exactly invariant; being O(3)-invariant it
    gives the two mirror images identical outputs. Measured (L = 2, C = 8): d 0.28 / 0.37, floor 2e-14 /
    3e-15; chiral d = 0 exactly."""
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    study = importlib.import_module("study_expressivity")
    cell = dict(task="counterexample", params=dict(body=2), model="MACE (correlation 3)", lmax=2, layers=1)
    two = study.cell_separation(cell, 8, seeds=2)
    assert min(two["per_seed"]) > 1e-2 and max(two["floor_per_seed"]) < 2e-13  # ~10x the measured floor
    chiral = study.cell_separation(dict(cell, params=dict(body=4, chiral=True)), 8, seeds=1)
    assert max(chiral["per_seed"]) < 1e-12


def test_trained_grid_variants_name_designs_and_message_grids(monkeypatch_module):
    """bench_trained_grid.py: the trained model first, then designs by degree, then message grids, then
    (``joint``) each design on each grid; a bad grid by name."""
    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_trained_grid")
    assert bench.variants([20], ["18x18", "24X12"]) == [
        ("trained", None), (20, {"est": {"grid": {"degree": 20}}}),
        ("messages 18x18", {"grid_resolution": [18, 18]}), ("messages 24x12", {"grid_resolution": [24, 12]})]
    with pytest.raises(SystemExit, match="'18' is not LATxLON"):
        bench.variants([], ["18"])
    joint = bench.variants([20, 24], ["24x24"], joint=True)
    assert [label for label, _ in joint] == [
        "trained", 20, 24, "messages 24x24", "20, messages 24x24", "24, messages 24x24"]
    assert joint[-1][1] == {"est": {"grid": {"degree": 24}}, "grid_resolution": [24, 24]}


def test_trained_grid_rows_of_other_checkpoints_are_kept(monkeypatch_module, monkeypatch, tmp_path):
    """A later seed's checkpoints add to a trained-grid table; the same checkpoint replaces its rows; rows
    measured on other data or frames are not mixed in."""
    import json

    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_trained_grid")
    monkeypatch.setattr(importlib.import_module("common"), "RESULTS", tmp_path)
    stored = [{"checkpoint": "s0", "v": 1}, {"checkpoint": "s1", "v": 2}]
    (tmp_path / "tg.json").write_text(json.dumps({"data": "d", "frames": 100, "rows": stored}))
    new = [{"checkpoint": "s1", "v": 3}, {"checkpoint": "s2", "v": 4}]
    assert [r["v"] for r in bench.merged_rows("tg", new, data="d", frames=100)] == [1, 3, 4]
    assert bench.merged_rows("tg", new, data="d", frames=50) == new
    assert bench.merged_rows("tg", new, data="other", frames=100) == new
    assert bench.merged_rows("absent", new, data="d", frames=100) == new


def test_update_cost_blocks_are_the_study_models_and_take_the_double_backward(monkeypatch_module):
    """bench_update_cost.py times layer 0's update block of each study model: the EST ones on their designs,
    the FFN on the tiny shape's grid or on 18 x 18; the double-backward call reaches the block's weights."""
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_update_cost")
    import torch

    points = {}
    for model in bench.MODELS:
        block = bench.update_block(model, 32, 64)
        points[model] = block.spherical.sft.num_points if block.spherical is not None else 0
        if model.startswith("est-ffn"):
            assert block.config.ffn_grid.resolution == ((18, 18) if "18x18" in model else (10, 9))
        x0, batch = torch.randn(40, 16, 32), torch.arange(40) // 20
        block.zero_grad()
        bench.steps(block, x0, batch)["fwd+double bwd"]()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters() if p.requires_grad)
    assert points == {"est-ffn": 0, "est-default": 146, "est-t14": 114, "est-ffn 18x18": 0}


def test_cap_saturation_reads_the_sigma_the_bound_uses(monkeypatch_module):
    """bench_cap_saturation.py: one sigma per atom and head per capped layer, the one the bound acts on: doubling
    layer 1's query/key/value map quadruples its sigma (A = A_q A_k^T) and leaves layer 0's; the hook is gone after."""
    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_cap_saturation")
    import numpy as np
    import torch
    from ase.build import molecule
    from est.nn import spherical_transformer as st
    from forces_setup import random_model

    torch.manual_seed(0)
    model = random_model("est-default").eval()
    frames = [molecule("CH3CH2OH"), molecule("H2O")]
    layers = bench.capped_layers(model)
    heads = layers[0].config.num_heads
    before = bench.sigma_by_layer(model, frames)
    assert len(layers) == len(before) == 2 and all(s.shape == (12 * heads,) and (s > 0).all() for s in before)
    with torch.no_grad():
        for p in layers[1].qkv.parameters():
            p.mul_(2.0)
    after = bench.sigma_by_layer(model, frames)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6)
    np.testing.assert_allclose(after[1], 4.0 * before[1], rtol=1e-4)
    assert st.SphericalTransformer._logit_sigma.__name__ == "_logit_sigma"
    row = bench.summarize([np.array([1.0, 5.0, 9.0, 3.0])], cap=4.0)
    assert row == {"L0 median": 4.0, "L0 >c": 0.5, "L0 >2c": 0.25}


def test_cap_saturation_keeps_the_rows_of_runs_read_before(monkeypatch_module, monkeypatch, tmp_path):
    """Runs of another sitting (no longer on disk) keep their stored rows; a run read again replaces its own;
    rows stored at another ``--every`` are dropped, never mixed."""
    import json

    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_cap_saturation")
    monkeypatch.setattr(sys.modules["common"], "RESULTS", tmp_path)

    def row(mol, model, seed, weights, median):
        return {"molecule": mol, "model": model, "seed": seed, "weights": weights, "L0 median": median}

    stored = [row("aspirin", "est-default", 2, "initial", 1.0), row("aspirin", "est-default", 2, "trained", 2.0),
              row("ethanol", "est-default@time", 0, "trained", 3.0)]
    (tmp_path / "cap_saturation.json").write_text(json.dumps({"every": 25, "rows": stored}))
    new = [row("ethanol", "est-cap8", 0, "trained", 7.0), row("ethanol", "est-cap8", 0, "initial", 6.0),
           row("ethanol", "est-default@time", 0, "trained", 4.0)]
    merged = bench.with_earlier_rows(new, 25)
    assert [(r["molecule"], r["model"], r["weights"], r["L0 median"]) for r in merged] == [
        ("aspirin", "est-default", "initial", 1.0), ("aspirin", "est-default", "trained", 2.0),
        ("ethanol", "est-cap8", "initial", 6.0), ("ethanol", "est-cap8", "trained", 7.0),
        ("ethanol", "est-default@time", "trained", 4.0)]
    assert bench.with_earlier_rows(new[:1], 20) == new[:1]


def test_step_cost_lmax_times_the_18x18_pair_at_each_degree_and_width(monkeypatch_module, monkeypatch, tmp_path,
                                                                      capsys):
    """bench_step_cost_lmax.py: the study's 18 x 18 pair, rebuilt at each (L, C) through the study's own overrides,
    timed by the study's clock; r is the EST default's step over EquiformerV2's."""
    import json

    from est.train import load_config

    monkeypatch_module.syspath_prepend(str(BENCH / "baseline"))
    monkeypatch_module.syspath_prepend(str(BENCH))
    bench = importlib.import_module("bench_step_cost_lmax")
    fs = importlib.import_module("forces_setup")
    for model, update in zip(bench.PAIR, ("ffn", "est")):
        overrides = [*fs.est_overrides(model, tmp_path, "ethanol", 0, tmp_path / "run", fs.FULL), *bench.shape(6, 128)]
        cfg = load_config(overrides, check=False).model
        assert (cfg["update"], cfg.lmax, cfg.channels, cfg.edge_channels, cfg.ffn_hidden_channels) == (update, 6, 128, 128, 128)
        assert list(cfg.grid_resolution) == [18, 18] and cfg.regress_forces == "gradient"
    calls = []

    def calibrate(molecule, models, data_dir, budget, *, rounds, extra):
        calls.append((molecule, tuple(models), rounds, extra))
        lmax = int(extra[0].split("=")[1])
        return {models[0]: {"cpu_s": 2.0, "rounds": rounds}, models[1]: {"cpu_s": 2.0 * (0.8 + 0.05 * lmax), "rounds": rounds}}

    monkeypatch.setattr(bench, "calibrate", calibrate)
    monkeypatch.setattr(importlib.import_module("common"), "RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="no training set"):
        bench.main(["--data-dir", str(tmp_path)])
    (tmp_path / "ethanol" / "train").mkdir(parents=True)
    assert bench.main(["--data-dir", str(tmp_path), "--lmax", "4", "6", "--channels", "32", "--repeats", "2",
                       "--rounds", "3"]) == 0
    assert [c[3][:2] for c in calls] == [("model.lmax=4", "model.channels=32")] * 2 + [("model.lmax=6", "model.channels=32")] * 2
    assert all(c[1] == bench.PAIR and c[2] == 3 for c in calls)
    rows = json.loads((tmp_path / "step_cost_lmax.json").read_text())["rows"]
    assert [(r["L"], r["C"], r["EST design"]) for r in rows] == [(4, 32, "t = 16, S = 146"), (6, 32, "t = 18, S = 182")]
    assert [r["r (mean)"] for r in rows] == pytest.approx([1.0, 1.1]) and rows[0]["calibrations x rounds"] == "2 x 3"
    assert "| 6 | 32 | t = 18, S = 182 |" in capsys.readouterr().out
    # re-timing one (L, C) replaces its row and keeps the others; another molecule's rows are not mixed in
    assert bench.main(["--data-dir", str(tmp_path), "--lmax", "6", "3", "--channels", "32", "--repeats", "1",
                       "--rounds", "5"]) == 0
    rows = json.loads((tmp_path / "step_cost_lmax.json").read_text())["rows"]
    assert [(r["L"], r["calibrations x rounds"]) for r in rows] == [(3, "1 x 5"), (4, "2 x 3"), (6, "1 x 5")]
    (tmp_path / "aspirin" / "train").mkdir(parents=True)
    assert bench.main(["--data-dir", str(tmp_path), "--molecule", "aspirin", "--lmax", "4", "--channels", "32",
                       "--repeats", "1"]) == 0
    assert [r["L"] for r in json.loads((tmp_path / "step_cost_lmax.json").read_text())["rows"]] == [4]

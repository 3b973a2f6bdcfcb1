#!/usr/bin/env python
"""Render the benchmark results (``benchmarks/results/*.json``) as one Markdown page, PNG plots and README tables.

Reads what the benchmark scripts wrote (nothing is re-measured):

* ``accuracy.json`` (``study_accuracy.py``): test MAE at equal budget, mean
  ± sd over seeds, and the equivariance of the trained models;
* ``vs_fairchem.json`` (``bench_vs_fairchem.py``): training-step speedup and
  memory vs fairchem per shape;
* ``vs_fairchem_gpu_s2ef.json`` (``gpu_s2ef.py``): the H200 S2EF-2M run;
* ``equivariance_training.json``, ``vs_fairchem_equivariance.json``: their
  stored tables.

Writes ``benchmarks/results/SUMMARY.md`` (every table, with its source) and
``benchmarks/results/plots/*.png``. With ``--docs``, the blocks in README.md and docs/results.md
between ``<!-- summary:NAME -->`` and ``<!-- /summary:NAME -->`` are replaced
by the tables named NAME (``accuracy-qm9``, ``accuracy-emt``,
``accuracy-equivariance``, ``ablation-qm9``, ``ablation-emt``, and the same
with a ``grid18-`` prefix for ``accuracy_grid18.json``), so the README shows
exactly what the JSON holds; ``expressivity.json`` (``study_expressivity.py``)
gives the blocks ``expressivity-rotsym``, ``-kchain`` and ``-counterexample`` (with
``expressivity_separation.json``: ``-rotsym-separation``, ``-kchain-separation``,
``-counterexample-separation``), ``expressivity_lr1e-3.json`` (``--lr 1e-3 --tasks
counterexample``) the block ``expressivity-lr1e-3-counterexample``; ``forces.json``
(``study_forces.py``) the blocks ``forces-<molecule>``, ``forces-<molecule>-time``, ``forces-overview``
and ``forces-stages``;
``torch_sim.json`` (``bench_torch_sim.py``) the block ``torch-sim``; ``cpu_malloc.json``
(``bench_cpu_malloc.py``) the block ``cpu-malloc``; ``update_cost.json`` (``bench_update_cost.py``) the
block ``update-cost``; ``cap_saturation.json`` (``bench_cap_saturation.py``) the block ``cap-saturation``;
``step_cost.json`` (``bench_step_cost.py``) the block ``step-cost``; ``step_cost_lmax.json``
(``bench_step_cost_lmax.py``) the block ``step-cost-lmax``; every ``trained_grid*.json``
(``bench_trained_grid.py --out trained_grid...``) the block of its name with dashes, e.g. ``trained-grid-coarse``.

    python benchmarks/summary.py [--docs] [--no-plots]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from common import EST_UNCAPPED_LABEL, RESULTS, load, markdown_table, mean_sd, paired, save_figure

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
#: pages whose ``<!-- summary:NAME -->`` blocks ``--docs`` re-renders
PAGES = (README, HERE.parent / "docs" / "results.md")

#: (results name, the script that wrote it, whether docs/results.md has its block ``<name with dashes>``): files
#: whose rendered ``tables`` are stored in them and shown as they are
STORED_TABLES = (("vs_fairchem", "bench_vs_fairchem.py", False),
                 ("vs_fairchem_equivariance", "bench_equivariance_vs_fairchem.py", False),
                 ("equivariance_training", "study_equivariance_training.py", False),
                 ("torch_sim", "bench_torch_sim.py", True), ("cpu_malloc", "bench_cpu_malloc.py", True),
                 ("update_cost", "bench_update_cost.py", True), ("cap_saturation", "bench_cap_saturation.py", True),
                 ("step_cost", "bench_step_cost.py", True), ("step_cost_lmax", "bench_step_cost_lmax.py", True))
#: the models of the main comparison, in table order (the rest are ablations)
MAIN = ["fairchem", "est-ffn", "est-default", "est-hybrid0"]
#: (title, metric key, scale to the reporting unit), per data set
METRICS = {
    "qm9": [("gap (meV)", "mae_gap", 1.0), ("U0 (meV)", "mae_U0", 1.0), ("mu (D)", "mae_mu", 1.0),
            ("alpha (a0^3)", "mae_alpha", 1.0)],
    "emt": [("energy (meV)", "energy_mae", 1000.0), ("forces (meV/A)", "forces_mae", 1000.0),
            ("EFwT (%)", "efwt", 100.0)],
}
PRIMARY = {"qm9": "mae_gap", "emt": "forces_mae"}
LABELS = {"fairchem": "fairchem EquiformerV2", "est-ffn": "est EquiformerV2 (`update=\"ffn\"`)",
          "est-default": "est EST (default)", "est-paper": "est EST (paper preset)",
          "est-hybrid0": "est EST, previous default (hybrid, per-point)",
          "est-spherical0": "est spherical only, previous (per-point)", "est-t4": "previous default, ST on t=4 (S=12)",
          "est-t8": "previous default, ST on t=8 (S=36)", "est-t12": "previous default, ST on t=12 (S=86)",
          "est-default-t8": "EST default, uncapped, on t=8 (S=36; the L=2 default before t >= 16)",
          "est-default-t12": "EST default, uncapped, on t=12 (S=86)",
          "est-uncapped": EST_UNCAPPED_LABEL, "est-t14": "EST default on a degree-14 design (S=114)",
          "est-ffn-eqv2init": "est-ffn + EquiformerV2 init", "est-ffn-strict": "est-ffn + strict max_neighbors",
          "est-ffn-roll": "est-ffn + random edge roll", "est-ffn-fairchem": "est-ffn + all three",
          "est-ffn-twin": "est-ffn + all three, from fairchem's initial weights",
          "fairchem-redraw": "fairchem, another initial draw (the seed's data order)"}


#: ablations that change one thing of another model (besides est-ffn-*, on est-ffn): their row gets the
#: per-seed ratio to it
REFERENCE_OF = {"est-uncapped": "est-default", "est-t14": "est-default"}


def reference_of(model: str) -> str | None:
    """The model an ablation changes one thing of, or None."""
    return REFERENCE_OF.get(model) or ("est-ffn" if model.startswith("est-ffn-") else None)


def ablation_order(per_model: dict[str, Any]) -> list[str]:
    """The models outside :data:`MAIN` in :data:`LABELS` order (one factor at a time before the combinations), then the rest."""
    known = list(LABELS)
    return sorted((m for m in per_model if m not in MAIN), key=lambda m: known.index(m) if m in known else len(known))


def accuracy_tables(acc: dict[str, Any]) -> dict[str, str]:
    """``accuracy-<data>`` (main models), ``ablation-<data>`` (the others), ``accuracy-equivariance``."""
    out: dict[str, str] = {}
    eq_rows = []
    for data, per_model in acc["runs"].items():
        base = per_model.get("fairchem")
        for kind, names in (("accuracy", [m for m in MAIN if m in per_model]),
                            ("ablation", ["est-default"] * ("est-default" in per_model) + ablation_order(per_model))):
            if not names or (kind == "ablation" and not [m for m in names if m != "est-default"]):
                continue
            rows = []
            for model in names:
                recs = per_model[model]
                if kind == "ablation" and model == "est-default":
                    recs = [r for r in recs if r["seed"] == 0]  # ablations ran seed 0 only
                row = {"model": LABELS.get(model, model), "seeds": len(recs)}
                for title, key, scale in METRICS[data]:
                    row[title] = mean_sd([r["metrics"].get(key, float("nan")) for r in recs], scale)
                if base:
                    ratios, wins = paired(recs, base, PRIMARY[data])
                    if ratios:
                        row[f"{PRIMARY[data]} / fairchem (per seed)"] = (
                            " ".join(f"{x:.2f}" for x in ratios) + (f" ({wins}/{len(ratios)} lower)" if model != "fairchem" else ""))
                ref = reference_of(model) if kind == "ablation" else None
                if ref in per_model:  # one factor on top of ref: its effect, paired by seed
                    ratios, wins = paired(recs, per_model[ref], PRIMARY[data])
                    if ratios:
                        row[f"/ {ref} (per seed; mean)"] = (" ".join(f"{x:.3f}" for x in ratios)
                                                            + f"; {statistics.fmean(ratios):.3f} ({wins}/{len(ratios)} lower)")
                rows.append(row)
            if kind == "accuracy":
                mp = per_model[names[0]][0]["metrics"]
                rows.append({"model": "mean predictor", "seeds": "", **{
                    title: mean_sd([mp.get("base_" + key, float("nan"))], scale) for title, key, scale in METRICS[data]
                    if key != "efwt"}})
            cols = []
            for r in rows:
                cols += [c for c in r if c not in cols]
            out[f"{kind}-{data}"] = markdown_table(rows, cols)
        for model, recs in per_model.items():
            eq = [r["equivariance"] for r in recs if "equivariance" in r]
            if not eq:
                continue
            for sample in [k for k in eq[0] if k != "output"]:
                vals = [e[sample] for e in eq]
                row = {"data": data, "model": LABELS.get(model, model), "output": eq[0]["output"], "sample": sample,
                       "seeds": len(vals), "max rel. error": f"{max(vals):.1e}", "median": f"{statistics.median(vals):.1e}"}
                if base and model != "fairchem":
                    b = [r["equivariance"][sample] for r in base if "equivariance" in r]
                    if b:  # > 1: less equivariant than fairchem (the target is <= 0.1)
                        row["max error / fairchem's"] = f"{max(vals) / max(max(b), 1e-300):.2g}"
                eq_rows.append(row)
    if eq_rows:
        out["accuracy-equivariance"] = markdown_table(eq_rows, ["data", "model", "output", "sample", "seeds", "max rel. error",
                                                        "median", "max error / fairchem's"])
    return out


def plot_accuracy(acc: dict[str, Any], plots: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for data, per_model in acc["runs"].items():
        models = [m for m in MAIN if m in per_model] + [m for m in per_model if m not in MAIN]
        mets = [m for m in METRICS[data] if m[1] != "efwt"]
        fig, axes = plt.subplots(1, len(mets), figsize=(3.2 * len(mets), 3.2), squeeze=False)
        for ax, (title, key, scale) in zip(axes[0], mets):
            for i, model in enumerate(models):
                vals = [r["metrics"][key] * scale for r in per_model[model]]
                ax.bar(i, statistics.fmean(vals), color="C0" if model == "fairchem" else ("C1" if model in MAIN else "C7"))
                ax.plot([i] * len(vals), vals, "k.", ms=4)
            ax.set_xticks(range(len(models)), models, rotation=60, ha="right", fontsize=7)
            ax.set_title(title, fontsize=9)
        written.append(save_figure(fig, plots / f"accuracy_{data}.png", title=f"{data}: {per_model[models[0]][0]['split']} "
                                   "MAE at equal budget (bars: mean, dots: seeds)"))
    return written


def plot_speed(vs: dict[str, Any], plots: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in vs["rows"] if r.get("train_speedup_vs_fairchem") and r["model"] != "fairchem"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    w = 0.8 / max(len(models), 1)
    for j, model in enumerate(models):
        ys = [next((r["train_speedup_vs_fairchem"] for r in rows if r["shape"] == s and r["model"] == model), float("nan"))
              for s in shapes]
        ax.bar([i + j * w for i in range(len(shapes))], ys, width=w, label=model)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.4, color="r", lw=0.8, ls="--", label="target 1.4x (ffn)")
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))], shapes)
    ax.set_ylabel("training step speedup vs fairchem")
    ax.set_ylim(0, 1.9)
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    return [save_figure(fig, plots / "speed_vs_fairchem.png")]


def replace_blocks(text: str, blocks: dict[str, str]) -> tuple[str, list[str]]:
    """Replace every ``<!-- summary:NAME -->...<!-- /summary:NAME -->`` whose NAME is in ``blocks``."""
    done = []

    def sub(m):
        name = m.group(1)
        if name not in blocks:
            return m.group(0)
        done.append(name)
        return f"<!-- summary:{name} -->\n{blocks[name]}\n<!-- /summary:{name} -->"

    return re.sub(r"<!-- summary:([\w-]+) -->.*?<!-- /summary:\1 -->", sub, text, flags=re.S), done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", "--readme", dest="docs", action="store_true",
                   help="also replace the summary blocks in README.md and docs/results.md")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    sections: list[str] = ["# Benchmark summary", "", "Rendered by `python benchmarks/summary.py` from `benchmarks/results/*.json`."]
    blocks: dict[str, str] = {}
    acc = load("accuracy")
    # (results name, README block prefix): the main study, and the same study on the published 18x18 grid
    for result, prefix in (("accuracy", ""), ("accuracy_grid18", "grid18-"), ("parity", "parity-")):
        d = load(result)
        if not d:
            continue
        for name, tbl in accuracy_tables(d).items():
            blocks[prefix + name] = tbl
            sections += ["", f"## {prefix}{name} (`study_accuracy.py`, {' '.join(d.get('overrides') or []) or 'as configured'})",
                         "", tbl]
    for name, script, block in STORED_TABLES:
        d = load(name)
        if not d or not d.get("tables"):
            continue
        tables = d["tables"].values() if isinstance(d["tables"], dict) else d["tables"]
        sections += ["", f"## {name} (`{script}`)"] + [f"\n{t}" for t in tables]
        if block:
            blocks[name.replace("_", "-")] = "\n\n".join(tables)
    for name in sorted(f.stem for f in RESULTS.glob("trained_grid*.json")):  # docs/results.md blocks trained-grid*
        grid = load(name)
        if not grid:
            continue
        rows = [dict(model=Path(r["checkpoint"]).name, design="as trained" if r["degree"] == "trained" else r["degree"],
                     points=r["points"] or "-", **{"test forces (meV/A)": f"{r['force_mae_meV_A']:.2f}",
                                            "change vs trained (meV/A)": f"{r['change_meV_A']:.2g}",
                                            "rotation error": f"{r['rotation_error']:.1e}",
                                            "time / trained": f"{r['time_vs_trained']:.2f}"}) for r in grid["rows"]]
        block = name.replace("_", "-")
        blocks[block] = markdown_table(rows, list(rows[0]))
        sections += ["", f"## {name} (`bench_trained_grid.py`)", "", blocks[block]]
    expr = load("expressivity")
    expr_lr = load("expressivity_lr1e-3")  # the counterexamples again at lr 1e-3 (trainability, not the protocol)
    if expr or expr_lr:
        sys.path.insert(0, str(HERE))
        from study_expressivity import tables as expressivity_tables
    if expr:
        for name, tbl in expressivity_tables(expr, echo=False, separation=load("expressivity_separation")).items():
            blocks[f"expressivity-{name}"] = tbl
            sections += ["", f"## expressivity-{name} (`study_expressivity.py`)", "", tbl]
    if expr_lr:
        tbl = expressivity_tables(expr_lr, echo=False)["counterexample"]
        blocks["expressivity-lr1e-3-counterexample"] = tbl
        sections += ["", "## expressivity-lr1e-3-counterexample (`study_expressivity.py --lr 1e-3`)", "", tbl]
    forces = load("forces")
    if forces:
        sys.path.insert(0, str(HERE))
        from forces_tables import tables as forces_tables

        for name, tbl in forces_tables(forces["runs"], clock=forces.get("clock", "cpu")).items():
            blocks[name] = tbl
            sections += ["", f"## {name} (`study_forces.py`, {forces.get('clock', 'cpu')} clock)", "", tbl]
    gpu = load("vs_fairchem_gpu_s2ef")
    if gpu and gpu.get("table"):
        sections += ["", "## vs_fairchem_gpu_s2ef (`gpu_s2ef.py`)", "", gpu["table"]]
    (RESULTS / "SUMMARY.md").write_text("\n".join(sections) + "\n")
    print(f"[summary] wrote {RESULTS / 'SUMMARY.md'}")
    if not args.no_plots:
        plots = RESULTS / "plots"
        plots.mkdir(exist_ok=True)
        written = (plot_accuracy(acc, plots) if acc else [])
        vs = load("vs_fairchem")
        written += plot_speed(vs, plots) if vs else []
        for w in written:
            print(f"[summary] wrote {w}")
    if args.docs:
        done: list[str] = []
        for page in PAGES:
            text, page_done = replace_blocks(page.read_text(), blocks)
            page.write_text(text)
            done += page_done
            print(f"[summary] {page.name}: blocks replaced: {', '.join(page_done) or 'none'}")
        missing = sorted(set(blocks) - set(done))
        if missing:
            print(f"[summary] no block on any page for: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

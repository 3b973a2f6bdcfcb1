#!/usr/bin/env python
r"""How hard the EST default's logit bound binds in the force study's trained models, per layer and seed.

The default spherical Transformer bounds its content logits (``est.nn.spherical_transformer``, step 5): per
atom and head the logit matrix :math:`A = A_q A_k^\top/\sqrt{d'}` is scaled by :math:`c\tanh(\sigma/c)/\sigma`
with :math:`\sigma = \|A\|_F` and :math:`c` = ``logit_cap`` (4), so :math:`|\ell| < c`. Where
:math:`\sigma \gg c` the bound binds: the logits' size is :math:`c` whatever :math:`A` is, the loss no longer
sees :math:`\sigma` (its gradient falls like :math:`\mathrm{sech}^2(\sigma/c)`) and only :math:`A`'s
direction trains. This script reads :math:`\sigma` off every trained EST run of ``study_forces.py`` on
disk (``ROOT/<molecule>/<model>-s<seed>``, its ``best.pt``, EMA weights) over every ``--every``-th test
frame, next to the same model at its initialisation (rebuilt from the checkpoint's config with the run's
seed, as the trainer does), and puts each run's test force MAE ratio to est's EquiformerV2 of the same seed
(``forces.json``) beside it: does a seed whose bound binds harder train worse?

Columns per layer: the median of :math:`\sigma` over atoms and heads, and the share of them with
:math:`\sigma > c` and :math:`> 2c`. Nothing is trained; float32, one thread. The rows of runs read before
(``cap_saturation.json``, same ``--every``) that are no longer on disk are kept; a run read again replaces its.

    python benchmarks/bench_cap_saturation.py [--root runs/forces] [--data-dir /work/data/xtb] [--every 25]
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

from common import dash_missing, load, print_table, save, setup_threads, with_stored_rows  # noqa: E402

#: the study's run folders: ``<model>-s<seed>``
RUN_GLOB = "est-*-s*"


@contextmanager
def record_sigma():
    """Within the block, every capped ``SphericalTransformer`` call appends ``(module, sigma [N * H])`` to the
    yielded list: the ``_logit_sigma`` its bound uses, as it returns it."""
    from est.nn import spherical_transformer as st

    seen: list[tuple[object, np.ndarray]] = []
    original = st.SphericalTransformer._logit_sigma

    def recording(self, a):  # a [N, H, K, K]
        sigma = original(self, a)  # [N, H]
        seen.append((self, sigma.detach().flatten().double().numpy()))  # [N * H]
        return sigma

    st.SphericalTransformer._logit_sigma = recording
    try:
        yield seen
    finally:
        st.SphericalTransformer._logit_sigma = original


def capped_layers(model) -> list:
    """The model's spherical Transformers with a logit bound, in forward order."""
    from est.nn.spherical_transformer import SphericalTransformer

    return [m for m in model.modules() if isinstance(m, SphericalTransformer) and m.config.logit_cap is not None]


def sigma_by_layer(model, frames: list) -> list[np.ndarray]:
    """Per capped layer of ``model`` (forward order): sigma of every atom and head over ``frames`` (ASE Atoms)."""
    from est.calculators import ESTCalculator

    layers = capped_layers(model)
    calc = ESTCalculator(model=model, energy_mean=0.0, energy_std=1.0, dtype=torch.float32,
                         elements=sorted({int(z) for a in frames for z in a.numbers}))
    with record_sigma() as seen:
        calc.predict_batch(frames, properties=("energy",))
    return [np.concatenate([s for m, s in seen if m is layer]) for layer in layers]


def summarize(sigmas: list[np.ndarray], cap: float) -> dict[str, float]:
    """``L<i> median``, ``L<i> >c``, ``L<i> >2c`` per layer (shares in [0, 1])."""
    out = {}
    for i, s in enumerate(sigmas):
        out |= {f"L{i} median": float(np.median(s)), f"L{i} >c": float(np.mean(s > cap)),
                f"L{i} >2c": float(np.mean(s > 2 * cap))}
    return out


def frames_of(data_dir: Path, molecule: str, every: int) -> list:
    """Every ``every``-th frame of ``DATA/<molecule>/test`` as ASE Atoms."""
    from est.data import LmdbDataset
    from est.data.aselmdb import sample_to_atoms

    ds = LmdbDataset(str(data_dir / molecule / "test"))
    return [sample_to_atoms(ds[i])[0] for i in range(0, len(ds), every)]


def trained_and_initial(run: Path):
    """``(trained model, the same model at its initialisation, seed)`` of one study run."""
    from est.train.loading import build_model_from_config, checkpoint_config, load_trained_model
    from est.train.trainer import _set_seed

    trained, ck = load_trained_model(str(run), map_location="cpu")
    cfg = checkpoint_config(ck)
    _set_seed(int(cfg.seed))  # what the trainer does right before building the model
    initial = build_model_from_config({"model": cfg.model}).eval()
    return trained, initial, int(cfg.seed)


def ratio_to_ffn(forces: dict | None, molecule: str, model: str, seed: int) -> float:
    """The run's test force MAE / est-ffn's of the same seed, from ``forces.json`` (nan when either is missing)."""
    runs = (forces or {}).get("runs", {}).get(molecule, {})

    def mae(m):
        rec = next((r for r in runs.get(m, []) if r["seed"] == seed), None)
        return (rec or {}).get("metrics", {}).get("forces_mae_meV_A", float("nan"))

    return mae(model) / mae("est-ffn")


def row_key(row: dict) -> tuple:
    return row["molecule"], row["model"], row["seed"], row["weights"]


def with_earlier_rows(rows: list[dict], every: int) -> list[dict]:
    """``rows`` and the stored rows of ``cap_saturation.json`` (read at the same ``every``) of runs not among
    them (another sitting's run folders), sorted by molecule, model, seed, initial before trained."""
    merged = with_stored_rows("cap_saturation", rows, row_key, same={"every": every})
    return sorted(merged, key=lambda r: (r["molecule"], r["model"], r["seed"], r["weights"] != "initial"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=str(HERE.parent / "runs" / "forces"))
    p.add_argument("--data-dir", default="/work/data/xtb")
    p.add_argument("--every", type=int, default=25, help="every n-th test frame (500 frames: 20)")
    args = p.parse_args(argv)
    threads = setup_threads(1)
    root, data_dir = Path(args.root), Path(args.data_dir)
    forces = load("forces")
    rows = []
    for mol_dir in sorted(d for d in root.iterdir() if d.is_dir() and (data_dir / d.name / "test").is_dir()):
        frames = frames_of(data_dir, mol_dir.name, args.every)
        for run in sorted(mol_dir.glob(RUN_GLOB)):
            if not (run / "best.pt").exists():
                continue
            trained, initial, seed = trained_and_initial(run)
            layers = capped_layers(trained)
            if not layers:
                continue
            cap = layers[0].config.logit_cap
            model = run.name.rsplit("-s", 1)[0]
            for state, net in (("initial", initial), ("trained", trained)):
                rows.append({"molecule": mol_dir.name, "model": model, "seed": seed, "weights": state, "cap": cap,
                             **summarize(sigma_by_layer(net, frames), cap),
                             "test forces / EquiformerV2": (ratio_to_ffn(forces, mol_dir.name, model, seed)
                                                            if state == "trained" else float("nan"))})
    if not rows:
        print(f"[cap] no trained capped EST run with best.pt under {root}")
        return 1
    rows = with_earlier_rows(rows, args.every)
    shown = [{k: (f"{v:.2f}" if isinstance(v, float) and k.endswith(("median", "/ EquiformerV2")) else
                  f"{100 * v:.0f}%" if isinstance(v, float) and ">" in k else v) for k, v in r.items()} for r in rows]
    table = print_table(dash_missing(shown), list(shown[0]),
                        f"sigma = ||A||_F of the bounded logits per layer (cap c), every {args.every}th test frame, "
                        f"{threads} thread")
    save("cap_saturation", {"description": __doc__.split("\n")[0], "every": args.every, "root": str(root),
                            "rows": rows, "tables": {"cap-saturation": table.split("\n", 2)[2]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The force study's setup (``study_forces.py``): molecules, models, budget, run folders, data and the
``train.py`` overrides of one est run. No training, no tables."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from est.data.cache import atomic_text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "baseline"))

import common  # noqa: E402
import mace_baseline as mb  # noqa: E402

MOLECULES = ("ethanol", "malonaldehyde", "aspirin", "paracetamol")
#: every est model: the shape and the physics (conservative forces, smooth cutoff, isolated molecules)
SHAPE = ["model=eqv2_tiny", "model.regress_forces=gradient", "model.envelope=polynomial", "model.max_neighbors=null",
         "model.use_pbc=false", "model.cutoff=5.0", "model.avg_num_nodes=auto", "model.avg_degree=auto"]
#: eqv2-tiny's widths halved (32 -> 16 channels and attention hidden channels, 64 -> 32 feed-forward hidden)
HALF = ["model.channels=16", "model.attn_hidden_channels=16", "model.ffn_hidden_channels=32"]
#: EquiformerV2's published 18 x 18 grid instead of the tiny shape's 10 x 9, for every grid the model samples
#: (messages, FFN, heads; the EST block keeps its own design): trained, the 10 x 9 grid leaves est's
#: EquiformerV2 a rotation error of 6e-4 to 5.6e-3 on these molecules, 18 x 18 about 1e-6 (bench_trained_grid.py)
GRID18_SUFFIX = "-g18"
GRID18 = ["model.grid_resolution=[18,18]"]
#: the 18 x 18 pair at degree L = 6 (EquiformerV2's OC20 S2EF degree; mmax stays 2, the EST design follows L:
#: degree 18, 182 points): the two steps cost the same there (bench_step_cost_lmax.py), so the equal-time reading
#: is the equal-steps one; does accuracy move with L, and which way?
L6_SUFFIX = "-g18-l6"
L6 = [*GRID18, "model.lmax=6"]
#: eqv2-tiny's widths doubled (32 -> 64 channels and attention hidden channels, 64 -> 128 feed-forward hidden): the
#: EST block's per-point work (the S x S attention) does not grow with the channels, EquiformerV2's FFN on its grid
#: does, so at 64 channels the EST steps are the cheaper ones (the default's 0.95x EquiformerV2's, est-skip-t12's
#: 0.85x, timed round-robin on ethanol); does the accuracy gap move with width as it did when halved (est-half)?
WIDE_SUFFIX = "-w2"
WIDE = ["model.channels=64", "model.attn_hidden_channels=64", "model.ffn_hidden_channels=128"]
GATE_SUFFIX = "-gm"
GATE_MESSAGES = ["model.message_activation=gate"]
#: the recipe's learning rate (peak of the cosine schedule; est's trainer default, near EquiformerV2's OC20 4e-4),
#: and the study's one variant of it: twice the recipe, for est's EquiformerV2 and two EST models (does the recipe's
#: rate hide a gap?)
RECIPE_LR = "5e-4"
LR_SUFFIX = "-lr1e-3"
LEARNING_RATES = {m + LR_SUFFIX: "1e-3" for m in ("est-ffn", "est-default", "est-skip-t12")}
MACE = "mace"
#: suffixes of variants read against est's EquiformerV2 with the same suffix (the same grid and degree, the same
#: width, the same learning rate)
OWN_REFERENCE_SUFFIXES = (GRID18_SUFFIX, L6_SUFFIX, WIDE_SUFFIX, LR_SUFFIX)
#: the EST default block's overrides
EST_DEFAULT = ["model.update=est", "model.est.preset=default"]
#: the EST default with each point's value added to its attention output
EST_SKIP = [*EST_DEFAULT, "model.est.value_skip=true"]
#: est's EquiformerV2, and EST_SKIP on a degree-12 design: the bases of the gate and learning-rate variants
FFN = ["model.update=ffn"]
EST_SKIP_T12 = [*EST_SKIP, "model.est.grid.degree=12"]
#: model label -> overrides on top of SHAPE (``mace``: the MACE baseline, no overrides)
MODELS: dict[str, list[str]] = {
    "est-ffn": FFN,
    "est-default": [*EST_DEFAULT],
    "est-paper": ["model.update=est", "model.est.preset=paper"],
    "est-half": [*EST_DEFAULT, *HALF],
    "est-uncapped": common.EST_UNCAPPED,  # the default without its bound on the attention logits
    "est-half-uncapped": [*common.EST_UNCAPPED, *HALF],
    # the default on a degree-14 design (114 points instead of 146): a trained t = 16 model loses nothing
    # on it (bench_trained_grid.py); does one trained on it, at ~0.8x the attention's points?
    "est-t14": [*EST_DEFAULT, "model.est.grid.degree=14"],
    # the default with its logit bound doubled (c = 8): the bound binds in layer 1 of every trained default
    # (bench_cap_saturation.py); does a looser one train better, and what does it cost in equivariance?
    "est-cap8": [*EST_DEFAULT, "model.est.logit_cap=8"],
    # the default with each point's value added to its attention output (model.est.value_skip): a softmax row
    # is a convex average, so the default's output at a point is a blurred copy of the values; with the skip
    # the attention adds to EquiformerV2's pointwise S2 MLP instead of replacing it
    "est-skip": [*EST_SKIP],
    # est-skip on a degree-12 design (86 points, fewer than the 10 x 9 grid's 90 that EquiformerV2's FFN samples):
    # the attention's S^2 work at ~1/3 of the default's
    "est-skip-t12": EST_SKIP_T12,
    # est-skip-t12 with gate activations in the message block (model.message_activation=gate): no per-edge S2 grid
    # (0.80x the study's step); EquiformerV2's ablations lose accuracy with gates, does the EST block make up for
    # it? est-ffn-gm is the control: EquiformerV2 with the same messages
    "est-skip-t12" + GATE_SUFFIX: [*EST_SKIP_T12, *GATE_MESSAGES],
    "est-ffn" + GATE_SUFFIX: [*FFN, *GATE_MESSAGES],
    # EquiformerV2 and the EST default both on the 18 x 18 grid: the comparison at equal (trained) equivariance,
    # where EquiformerV2 pays for its finer sampling in the FFN and the EST block does not
    "est-ffn" + GRID18_SUFFIX: [*FFN, *GRID18],
    "est-default" + GRID18_SUFFIX: [*EST_DEFAULT, *GRID18],
    "est-ffn" + L6_SUFFIX: [*FFN, *L6],
    "est-default" + L6_SUFFIX: [*EST_DEFAULT, *L6],
    # est-ffn, the EST default and est-skip-t12 at twice the width (WIDE)
    "est-ffn" + WIDE_SUFFIX: [*FFN, *WIDE],
    "est-default" + WIDE_SUFFIX: [*EST_DEFAULT, *WIDE],
    "est-skip-t12" + WIDE_SUFFIX: [*EST_SKIP_T12, *WIDE],
    # est-ffn, the EST default and est-skip-t12 at learning rate 1e-3 (LEARNING_RATES; the model is unchanged)
    "est-ffn" + LR_SUFFIX: FFN,
    "est-default" + LR_SUFFIX: [*EST_DEFAULT],
    "est-skip-t12" + LR_SUFFIX: EST_SKIP_T12,
    MACE: [],
}
LABELS = {"est-ffn": "est EquiformerV2 (`update=\"ffn\"`)", "est-default": "est EST default (spherical Transformer only)",
          "est-paper": "est EST (paper preset)", "est-half": "est EST default, half width",
          "est-uncapped": f"est {common.EST_UNCAPPED_LABEL}",
          "est-half-uncapped": "est EST default, uncapped, half width",
          "est-t14": "est EST default on a degree-14 design (S = 114)",
          "est-cap8": "est EST default, logits bounded by 8 (not 4)",
          "est-skip": "est EST default, each point's value added to its attention output",
          "est-skip-t12": "est EST default with the value skip, on a degree-12 design (S = 86)",
          "est-skip-t12" + GATE_SUFFIX: "est EST default with the value skip, degree-12 design, gate messages",
          "est-ffn" + GATE_SUFFIX: "est EquiformerV2 with gate messages",
          "est-ffn" + GRID18_SUFFIX: "est EquiformerV2 on the 18 x 18 grid",
          "est-default" + GRID18_SUFFIX: "est EST default on the 18 x 18 grid",
          "est-ffn" + L6_SUFFIX: "est EquiformerV2 at L = 6 on the 18 x 18 grid",
          "est-default" + L6_SUFFIX: "est EST default at L = 6 on the 18 x 18 grid",
          "est-ffn" + WIDE_SUFFIX: "est EquiformerV2 at twice the width (64 channels)",
          "est-default" + WIDE_SUFFIX: "est EST default at twice the width (64 channels)",
          "est-skip-t12" + WIDE_SUFFIX: "est EST default with the value skip, degree-12 design, twice the width",
          "est-ffn" + LR_SUFFIX: "est EquiformerV2 at learning rate 1e-3",
          "est-default" + LR_SUFFIX: "est EST default at learning rate 1e-3",
          "est-skip-t12" + LR_SUFFIX: "est EST default with the value skip, degree-12 design, learning rate 1e-3",
          MACE: "MACE (L=2, 64 ch)"}
#: models run only when named (--models): the default without its logit bound, on a coarser design, with a looser
#: bound, with the value skip (on two designs, the degree-12 one also with gate messages, and EquiformerV2 with them);
#: EquiformerV2 and the default on the 18 x 18 grid, at L = 3 and at L = 6; three models at twice the width and
#: three at twice the recipe's learning rate
ABLATIONS = ("est-uncapped", "est-half-uncapped", "est-t14", "est-cap8", "est-skip", "est-skip-t12",
             "est-skip-t12" + GATE_SUFFIX, "est-ffn" + GATE_SUFFIX,
             "est-ffn" + GRID18_SUFFIX, "est-default" + GRID18_SUFFIX, "est-ffn" + L6_SUFFIX,
             "est-default" + L6_SUFFIX, *(m for m in MODELS if m.endswith(WIDE_SUFFIX)), *LEARNING_RATES)
REFERENCE = "est-ffn"
#: ``<model>@time``: ``<model>`` trained for as many steps as fit in est-ffn's time (its 1,500 steps x its step
#: cost), its schedule ending there (:func:`time_budget`): the equal-time reading on the test set
TIME_SUFFIX = "@time"
#: ``<model>@w2-time``: a model at the study's width trained in the time of est's EquiformerV2 at twice the width
#: (est-ffn-w2's 1,500 steps x its step cost) and read against it: the paper's "small models empowered by EST can
#: outperform larger models" at equal cost (the EST default: 395k parameters against 1.32M), with est-ffn as the
#: control (does the small model win by the steps its cheaper step buys, EST or not?)
WIDE_TIME_SUFFIX = "@w2-time"
#: timed suffix -> (the est EquiformerV2 whose time such a run trains in and is read against; None: the model's own
#: reference, :func:`reference_of`), the words its label ends with
TIMED_SUFFIXES = {TIME_SUFFIX: (None, "EquiformerV2's time"),
                  WIDE_TIME_SUFFIX: (REFERENCE + WIDE_SUFFIX, "the time of EquiformerV2 at twice the width")}
#: the models trained in est-ffn-w2's time: the study-width models read against est-ffn (not MACE)
WIDE_TIMED = [m + WIDE_TIME_SUFFIX for m in MODELS if m != MACE and not m.endswith(OWN_REFERENCE_SUFFIXES)]
#: --models choices: every model, every est model but the reference in EquiformerV2's time, and the study-width
#: models in est-ffn-w2's
MODEL_CHOICES = [*MODELS, *(m + TIME_SUFFIX for m in MODELS if m not in (MACE, REFERENCE)), *WIDE_TIMED]
#: per run folder: the NVE trajectory's state while it runs (``mace_baseline.nve_md(checkpoint=...)``; resumable)
MD_STATE = "md_state.json"
#: issue 17: EST default force MAE <= 0.90x est's EquiformerV2 at equal time (paired seeds)
TARGET = ("est-default", 0.90)
#: (model, its reference, words) read against the target's bound: the issue's pair, the same pair on 18 x 18, and the
#: value-skip ablations against est's EquiformerV2
TARGET_PAIRS = ((TARGET[0], REFERENCE, "Target (issue 17)"),
                (TARGET[0] + GRID18_SUFFIX, REFERENCE + GRID18_SUFFIX, "The same bound, both on the 18 x 18 grid"),
                ("est-skip", REFERENCE, "The same bound, the default with the value skip"),
                ("est-skip-t12", REFERENCE, "The same bound, the value skip on a degree-12 design"),
                (TARGET[0] + L6_SUFFIX, REFERENCE + L6_SUFFIX, "The same bound, both at L = 6 on the 18 x 18 grid"),
                (TARGET[0] + WIDE_SUFFIX, REFERENCE + WIDE_SUFFIX, "The same bound, both at twice the width"),
                ("est-skip-t12" + WIDE_SUFFIX, REFERENCE + WIDE_SUFFIX,
                 "The same bound, the value skip on a degree-12 design, both at twice the width"),
                (TARGET[0] + LR_SUFFIX, REFERENCE + LR_SUFFIX, "The same bound, both at learning rate 1e-3"),
                ("est-skip-t12" + LR_SUFFIX, REFERENCE + LR_SUFFIX,
                 "The same bound, the value skip on a degree-12 design, both at learning rate 1e-3"))
#: pairs read on the test set, each model trained in the same time (``@w2-time``: est-ffn-w2's): (model, the one it is
#: read against, words, bound). The paper's "small models empowered by EST can outperform larger models" at equal
#: cost (bound 1.00: a lower force MAE), its control (the small EquiformerV2 in the same time), and the issue's target
#: at that twice-as-long budget (the EST default against the small EquiformerV2, both in est-ffn-w2's time)
TEST_PAIRS = (("est-default" + WIDE_TIME_SUFFIX, REFERENCE + WIDE_SUFFIX,
               "Small EST against the larger model (the paper's claim), the EST default at 32 channels trained in the "
               "time of EquiformerV2 at 64", 1.0),
              (REFERENCE + WIDE_TIME_SUFFIX, REFERENCE + WIDE_SUFFIX,
               "Its control, est's EquiformerV2 at 32 channels trained in the time of EquiformerV2 at 64", 1.0),
              ("est-default" + WIDE_TIME_SUFFIX, REFERENCE + WIDE_TIME_SUFFIX,
               "The issue's target at twice the time, the EST default against est's EquiformerV2, both at 32 "
               "channels trained in the time of EquiformerV2 at 64", TARGET[1]))
#: --clock -> the curve key holding that clock's seconds ("step-cost": steps x the model's interleaved step cost)
CLOCKS = {"step-cost": "cost_seconds", "cpu": "cpu_seconds", "wall": "seconds"}
CLOCK_WORDS = {"step-cost": "steps x each model's step time on one thread, the est models timed round-robin, "
                            "MACE right after",
               "cpu": "each run's own CPU seconds", "wall": "each run's own wall seconds"}
CURVE_KEY = "forces_mae_meV_A"
#: frames per block of the paired bootstrap over the test trajectory (:func:`frame_ratio`), and per shown stretch
FRAME_BLOCK, SHOW_BLOCK = 25, 100


@dataclass(kw_only=True, frozen=True)
class Budget:
    """Data, training and MD budget of one run (identical for every model of a root)."""

    steps: int = 1500
    batch_size: int = 16
    eval_every: int = 50
    #: validation frames: the last ones of the training trajectory
    val_frames: int = 100
    #: training frames (the first ones); None: all but the validation frames
    train_frames: int | None = None
    #: test frames (the first ones); None: all
    test_frames: int | None = None
    md_ps: float = 10.0
    md_timestep_fs: float = 0.5
    md_temperature_K: float = 300.0

    @property
    def md_steps(self) -> int:
        return int(round(1000.0 * self.md_ps / self.md_timestep_fs))

    @property
    def md_every(self) -> int:
        """Record the MD energy every this many steps (at most about 2,000 records)."""
        return max(1, self.md_steps // 2000)


FULL = Budget()
QUICK = Budget(steps=12, eval_every=4, val_frames=16, train_frames=48, test_frames=32, md_ps=0.1)


def split_indices(n_train_file: int, budget: Budget) -> tuple[list[int], list[int]]:
    """(training, validation) indices into the training trajectory: validation is its last ``val_frames``."""
    n_val = budget.val_frames
    n_train = n_train_file - n_val if budget.train_frames is None else budget.train_frames
    if n_val < 1 or n_train < budget.batch_size or n_train + n_val > n_train_file:
        raise ValueError(f"{n_train_file} training frames cannot hold {n_train} for training (at least one batch of "
                         f"{budget.batch_size}) and {n_val} for validation. Fix: lower train_frames / val_frames")
    return list(range(n_train)), list(range(n_train_file - n_val, n_train_file))


def timed_suffix(model: str) -> str | None:
    """The key of :data:`TIMED_SUFFIXES` that ``model`` ends with, or None (a run of ``budget.steps``)."""
    return next((s for s in TIMED_SUFFIXES if model.endswith(s)), None)


def base_model(model: str) -> str:
    """The model a run trains: ``est-default@time`` and ``est-default@w2-time`` -> ``est-default``."""
    suffix = timed_suffix(model)
    return model.removesuffix(suffix) if suffix else model


#: models whose training step is another model's computation (the same operations on the same shapes, only a
#: constant differs: est-cap8's c = 8 in c tanh(sigma / c) / sigma, the learning rate of the -lr1e-3 models):
#: they take that model's calibrated step cost
SAME_STEP_AS = {"est-cap8": "est-default", **{m: m.removesuffix(LR_SUFFIX) for m in LEARNING_RATES}}


def reference_of(model: str) -> str:
    """The est EquiformerV2 a model is compared with (its ratios, its equal time, its ``@time`` budget): the one
    on the same grid, at the same width and learning rate; est-ffn-g18's, est-ffn-w2's and est-ffn-lr1e-3's is
    est-ffn (what the finer grid, the width, the faster rate does to EquiformerV2); est-ffn's is itself; a
    ``@w2-time`` run's is est-ffn-w2, in whose time it trains."""
    timed = timed_suffix(model)
    if timed and TIMED_SUFFIXES[timed][0]:
        return TIMED_SUFFIXES[timed][0]
    base = base_model(model)
    for suffix in OWN_REFERENCE_SUFFIXES:
        own = REFERENCE + suffix
        if base.endswith(suffix) and base != own:
            return own
    return REFERENCE


def cost_model(model: str) -> str:
    """The model whose calibrated step cost ``model`` is charged: its base model, or the one whose step it computes."""
    return SAME_STEP_AS.get(base_model(model), base_model(model))


def is_timed(model: str) -> bool:
    """A run whose step budget is another model's time (``@time``, ``@w2-time``), not ``budget.steps``."""
    return timed_suffix(model) is not None


def label(model: str) -> str:
    """Table label: the model's, plus "in EquiformerV2's time" for a ``@time`` run (in that of EquiformerV2 at
    twice the width for a ``@w2-time`` one)."""
    base, suffix = base_model(model), timed_suffix(model)
    base = LABELS.get(base, base)
    return f"{base}, trained in {TIMED_SUFFIXES[suffix][1]}" if suffix else base


def timed_steps(costs: dict[str, dict[str, Any]], model: str, budget: Budget) -> int:
    r"""Steps of ``model`` that cost what ``budget.steps`` of its reference (:func:`reference_of`) cost:
    :math:`\mathrm{round}(n\,c_\mathrm{ref} / c_\mathrm{model})` with the step costs ``c`` (CPU seconds) each is
    charged on the curves (:func:`cost_model`: a learning-rate variant is charged its model's)."""
    return max(1, round(budget.steps * costs[cost_model(reference_of(model))]["cpu_s"]
                        / costs[cost_model(model)]["cpu_s"]))


def run_dir(root: Path, molecule: str, model: str, seed: int) -> Path:
    return Path(root) / molecule / f"{model}-s{seed}"


def cached(path: Path, compute: Callable[[], Any], *, require: str | None = None) -> Any:
    """``compute()``, kept in ``path`` (JSON) so that a rerun of the job reuses it; a stored value without the
    key ``require`` (written before that key existed) is computed again."""
    if path.exists():
        value = json.loads(path.read_text())
        if require is None or require in value:
            return value
    value = compute()
    atomic_text(path, json.dumps(value, indent=1, default=float))
    return value


# ------------------------------------------------------------------ data
def molecule_dir(data_dir: Path, molecule: str) -> Path:
    d = Path(data_dir) / molecule
    missing = [p for p in (d / "train", d / "test", d / "relaxed.npz") if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(map(str, missing))} missing. Fix: generate the set with "
                                f"`python -m est.data.xtb --out {data_dir} --molecules {molecule}` or pass --data-dir")
    return d


def relaxed_atoms(data_dir: Path, molecule: str):
    """The GFN2-xTB minimum of ``molecule`` (no cell, not periodic): the MD start and the bond reference."""
    from ase import Atoms

    d = np.load(molecule_dir(data_dir, molecule) / "relaxed.npz")
    atoms = Atoms(numbers=d["numbers"], positions=d["positions"], pbc=False)
    atoms.info[mb.ENERGY_KEY] = float(d["energy"])
    atoms.arrays[mb.FORCES_KEY] = np.asarray(d["forces"], dtype=float)
    return atoms


def est_datasets(data_dir: Path, molecule: str, budget: Budget) -> dict[str, Any]:
    from est.data import LmdbDataset
    from est.train.data import IndexSubset

    d = molecule_dir(data_dir, molecule)
    train_file, test_file = LmdbDataset(str(d / "train")), LmdbDataset(str(d / "test"))
    train, val = split_indices(len(train_file), budget)
    n_test = len(test_file) if budget.test_frames is None else min(budget.test_frames, len(test_file))
    return {"train": IndexSubset(train_file, train), "val": IndexSubset(train_file, val),
            "test": IndexSubset(test_file, range(n_test))}


def mace_files(data_dir: Path, molecule: str, root: Path, budget: Budget) -> dict[str, str]:
    """The same frames as extxyz for MACE (written once per root): train, valid, test, relaxed."""
    from ase.io import write

    d = molecule_dir(data_dir, molecule)
    out = Path(root) / "data" / molecule
    files = {k: str(out / f"{k}.xyz") for k in ("train", "valid", "test", "relaxed")}
    if all(Path(f).exists() for f in files.values()):
        return files
    from est.data import LmdbDataset

    train, val = split_indices(len(LmdbDataset(str(d / "train"))), budget)
    mb.export_xyz(d / "train", files["train"], limit=len(train))
    mb.export_xyz(d / "train", files["valid"], start=val[0], limit=len(val))
    mb.export_xyz(d / "test", files["test"], limit=budget.test_frames)
    write(files["relaxed"], relaxed_atoms(data_dir, molecule), format="extxyz")
    return files


# ------------------------------------------------------------------ one est run's configuration
def est_overrides(model: str, data_dir: Path, molecule: str, seed: int, rd: Path, budget: Budget, *,
                  steps: int | None = None) -> list[str]:
    """``python train.py`` overrides of one est run (the datasets themselves are passed to the trainer);
    ``steps``: the step budget (default ``budget.steps``), which the warm-up and the schedule follow."""
    d = Path(data_dir) / molecule
    steps = budget.steps if steps is None else steps
    return [*SHAPE, *MODELS[base_model(model)], "data=oc20_s2ef", f"data.train_path={d / 'train'}", f"data.val_path={d / 'train'}",
            f"data.test_path={d / 'test'}", f"data.batch_size={budget.batch_size}", "data.eval_batch_size=32",
            "data.num_workers=0", f"trainer.max_steps={steps}", "trainer.max_epochs=100000",
            f"trainer.warmup_steps={max(1, steps // 30)}", f"trainer.eval_every={budget.eval_every}",
            f"trainer.lr={LEARNING_RATES.get(base_model(model), RECIPE_LR)}", "trainer.ema_decay=0.99",
            "trainer.energy_coefficient=2.0", "trainer.force_coefficient=100.0",
            "trainer.monitor=forces_mae", "trainer.final_splits=[]", f"trainer.log_every={budget.eval_every}",
            "trainer.resume=auto", "trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false",
            f"seed={seed}", f"run_dir={rd}", f"name=forces-{molecule}-{model}"]


def random_model(model: str, *extra: str, avg_num_nodes: float = 20.0, avg_degree: float = 14.0):
    """The est model ``model`` of the study (``SHAPE`` and its overrides, then ``extra``) with random weights
    from the current torch seed, for timing: the dataset statistics of ``auto`` are set by hand."""
    from omegaconf import OmegaConf

    from est.train import load_config
    from est.train.loading import build_model_from_config

    cfg = load_config([*SHAPE, *MODELS[model], f"model.avg_num_nodes={avg_num_nodes}",
                       f"model.avg_degree={avg_degree}", *extra], check=False)
    return build_model_from_config({"model": OmegaConf.to_container(cfg.model, resolve=True)})

r"""fairchem's EquiformerV2 (fairchem-core 1.10.0) at the shape of one of our ``ModelConfig``\ s.

The baseline lives in its own environment (``benchmarks/baseline/setup_fairchem.sh``,
default ``benchmarks/.venv-fairchem``); est never depends on it. Scripts call
:func:`reexec_in_baseline_env` first: when fairchem is not importable here but
the venv exists, the script restarts itself under the venv's Python (which
also has est installed, editable). When neither works, :func:`available`
returns ``False`` and :data:`MISSING` is the message to print; the scripts
then skip the baseline columns.

* :func:`comparable_config`: one of our named shapes with the two fields
  fairchem cannot vary made to match it (600 Gaussians, square grid) and a
  finite ``max_neighbors``.
* :func:`fairchem_kwargs` / :func:`build_fairchem`: the same hyperparameters
  as fairchem's ``EquiformerV2Backbone`` + ``equiformer_v2_energy_head`` +
  ``equiformer_v2_force_head`` in a ``HydraModel`` (the OC20 S2EF settings:
  grid MLP, separable S2 activation, SiLU, attention renormalisation).
* :class:`FairchemModel`: wraps it in our contract ``model(batch) ->
  {"energy" [B], "forces" [N, 3]}``; molecules (all ``pbc`` False) go into a
  cubic periodic box larger than their extent plus twice the cutoff
  (fairchem's non-periodic path needs torch-cluster).
* :func:`fairchem_to_est`: fairchem's weights into est's model of the same
  config (a fixed renaming, :func:`est_name`); :func:`est_twin`: est's model
  starting from fairchem's initial weights of a seed (``model._target_``).
* :func:`fairchem_callable`: ``fn(positions, numbers, cell, pbc) -> dict`` for
  ``est.testing.check_model``.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV = Path(os.environ.get("EST_FAIRCHEM_VENV", ROOT / "benchmarks" / ".venv-fairchem"))
MISSING = "baseline environment missing: run benchmarks/baseline/setup_fairchem.sh (fairchem columns skipped)"
_REEXEC_FLAG = "EST_FAIRCHEM_REEXEC"

#: fairchem's GaussianSmearing always has 600 Gaussians (num_distance_basis is ignored)
FAIRCHEM_NUM_RADIAL = 600


def _fairchem_importable() -> bool:
    return importlib.util.find_spec("fairchem") is not None


def reexec_in_baseline_env() -> None:
    """Restart this script under the baseline venv's Python if fairchem is not importable here.

    No-op when fairchem imports already, when the venv is absent, when
    ``EST_FAIRCHEM_REEXEC`` is set (the restarted process, or ``=0`` to opt out).
    """
    if _fairchem_importable() or os.environ.get(_REEXEC_FLAG):
        return
    py = VENV / "bin" / "python"
    if not py.exists():
        return
    if Path(sys.prefix).resolve() == VENV.resolve():  # already the venv (its python is a symlink)
        return
    os.environ[_REEXEC_FLAG] = "1"
    print(f"[baseline] restarting under {py} (fairchem's environment)", flush=True)
    sys.stdout.flush()
    os.execv(str(py), [str(py)] + sys.argv)


_IMPORT_ERROR: str | None = None


def _import_fairchem():
    """Import fairchem's EquiformerV2 path with the torch_scatter stand-in installed first."""
    global _IMPORT_ERROR
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import torch_scatter_stub  # noqa: F401  (registers itself as torch_scatter)

    logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fairchem.core.models.base import HydraModel
        import fairchem.core.models.equiformer_v2.equiformer_v2  # noqa: F401  (registers backbone + heads)
        import fairchem.core.models.equiformer_v2.heads  # noqa: F401
    return HydraModel


def available() -> bool:
    """True when fairchem's EquiformerV2 imports in this process."""
    global _IMPORT_ERROR
    if not _fairchem_importable():
        _IMPORT_ERROR = MISSING
        return False
    try:
        _import_fairchem()
    except Exception as err:  # noqa: BLE001 - report any import problem, skip the baseline
        _IMPORT_ERROR = f"fairchem import failed ({type(err).__name__}: {err}); {MISSING}"
        return False
    return True


def unavailable_reason() -> str:
    return _IMPORT_ERROR or MISSING


def fairchem_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("fairchem-core")
    except Exception:  # noqa: BLE001
        return None


def comparable_config(name: str, **overrides):
    """Our named shape with what fairchem cannot vary made to match.

    fairchem's EquiformerV2 always expands distances in 600 Gaussians and uses
    a square ``resolution x resolution`` grid; it needs a finite
    ``max_neighbors``. Other overrides (cutoff, update, ...) pass through.
    """
    from est.models import model_config

    cfg = model_config(name, **overrides)
    changes = {}
    if cfg.num_radial != FAIRCHEM_NUM_RADIAL:
        changes["num_radial"] = FAIRCHEM_NUM_RADIAL
    r = max(cfg.grid_resolution)
    if tuple(cfg.grid_resolution) != (r, r):
        changes["grid_resolution"] = (r, r)
    if cfg.max_neighbors is None:
        changes["max_neighbors"] = 20
    return cfg.replace(**changes) if changes else cfg


def fairchem_kwargs(cfg) -> dict:
    """``EquiformerV2Backbone`` keyword arguments for our :class:`est.models.ModelConfig`."""
    lat, lon = cfg.grid_resolution
    problems = []
    if lat != lon:
        problems.append(f"grid_resolution {cfg.grid_resolution} is not square (fairchem: one resolution)")
    if cfg.num_radial != FAIRCHEM_NUM_RADIAL:
        problems.append(f"num_radial={cfg.num_radial} (fairchem always uses 600 Gaussians)")
    if cfg.max_neighbors is None:
        problems.append("max_neighbors=None (fairchem needs a number)")
    if cfg.envelope is not None or cfg.radial_width_factor != 2.0:
        problems.append("envelope / radial_width_factor differ from fairchem's Gaussian smearing")
    if problems:
        raise ValueError("config not expressible in fairchem's EquiformerV2: " + "; ".join(problems)
                         + " (use comparable_config())")
    return dict(
        model="equiformer_v2_backbone",
        use_pbc=True,  # molecules go into a periodic box (see FairchemModel)
        use_pbc_single=False,
        regress_forces=cfg.regress_forces == "direct",
        otf_graph=True,
        max_neighbors=int(cfg.max_neighbors),
        max_radius=float(cfg.cutoff),
        max_num_elements=cfg.max_num_elements,
        num_layers=cfg.num_layers,
        sphere_channels=cfg.channels,
        attn_hidden_channels=cfg.attn_hidden_channels,
        num_heads=cfg.num_heads,
        attn_alpha_channels=cfg.attn_alpha_channels,
        attn_value_channels=cfg.attn_value_channels,
        ffn_hidden_channels=cfg.ffn_hidden_channels,
        norm_type=cfg.norm,
        lmax_list=[cfg.lmax],
        mmax_list=[cfg.mmax],
        grid_resolution=int(lat),
        num_sphere_samples=128,
        edge_channels=cfg.edge_channels,
        use_atom_edge_embedding=cfg.use_atom_edge_embedding,
        share_atom_edge_embedding=False,
        use_m_share_rad=False,
        distance_function="gaussian",
        num_distance_basis=cfg.num_radial,
        attn_activation="silu",
        use_s2_act_attn=False,
        use_attn_renorm=True,
        ffn_activation="silu",
        use_gate_act=False,
        use_grid_mlp=True,
        use_sep_s2_act=True,
        alpha_drop=cfg.alpha_drop,
        drop_path_rate=cfg.drop_path,
        proj_drop=0.0,
        weight_init="uniform",
        enforce_max_neighbors_strictly=True,
        avg_num_nodes=cfg.avg_num_nodes,
        avg_degree=cfg.avg_degree,
    )


def build_fairchem(cfg) -> nn.Module:
    """fairchem's ``HydraModel`` (EquiformerV2 backbone + heads) at ``cfg``'s shape.

    Heads follow the config: fairchem's energy head when ``regress_energy``,
    its direct force head when ``regress_forces == "direct"``, and, when
    ``num_targets > 0``, a ``[B, T]`` property head built from the same
    fairchem ``FeedForwardNetwork`` as its energy head with ``T`` output
    channels (:func:`_property_head_class`; fairchem has no multi-target head).
    """
    HydraModel = _import_fairchem()
    if cfg.update != "ffn":
        raise ValueError(f"fairchem's EquiformerV2 has the FFN update only; got update={cfg.update!r}")
    if cfg.regress_forces not in (None, "direct"):
        raise ValueError(f"fairchem's EquiformerV2 head predicts direct forces only; got regress_forces={cfg.regress_forces!r}")
    heads = {}
    if cfg.regress_energy:
        heads["energy"] = {"module": "equiformer_v2_energy_head", "reduce": cfg.energy_reduce}
    if cfg.regress_forces == "direct":
        heads["forces"] = {"module": "equiformer_v2_force_head"}
    if cfg.num_targets:
        _property_head_class()
        heads["properties"] = {"module": "est_bench_property_head", "num_outputs": int(cfg.num_targets),
                               "reduce": cfg.property_reduce}
    if not heads:
        raise ValueError("config asks for no output (regress_energy False, no forces, num_targets 0)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HydraModel(backbone=fairchem_kwargs(cfg), heads=heads, otf_graph=True)


_PROPERTY_HEAD = None


def _property_head_class():
    """Register (once) fairchem's energy head generalised to ``T`` outputs: ``properties [B, T]``."""
    global _PROPERTY_HEAD
    if _PROPERTY_HEAD is not None:
        return _PROPERTY_HEAD
    from functools import partial

    from fairchem.core.common.registry import registry
    from fairchem.core.models.base import HeadInterface
    from fairchem.core.models.equiformer_v2.transformer_block import FeedForwardNetwork
    from fairchem.core.models.equiformer_v2.weight_initialization import eqv2_init_weights

    class PropertyHead(nn.Module, HeadInterface):
        """Per-atom l = 0 output of a fairchem FFN with ``T`` channels, summed per graph / avg_num_nodes (or mean)."""

        def __init__(self, backbone, num_outputs: int = 1, reduce: str = "sum"):
            super().__init__()
            self.reduce, self.num_outputs = reduce, num_outputs
            self.avg_num_nodes = backbone.avg_num_nodes
            self.block = FeedForwardNetwork(
                backbone.sphere_channels, backbone.ffn_hidden_channels, num_outputs, backbone.lmax_list,
                backbone.mmax_list, backbone.SO3_grid, backbone.ffn_activation, backbone.use_gate_act,
                backbone.use_grid_mlp, backbone.use_sep_s2_act)
            self.apply(partial(eqv2_init_weights, weight_init=backbone.weight_init))

        def forward(self, data, emb):
            per_atom = self.block(emb["node_embedding"]).embedding[:, 0, :]  # [N, T] (l = 0)
            out = per_atom.new_zeros(len(data.natoms), self.num_outputs).index_add_(0, data.batch, per_atom)  # [B, T]
            if self.reduce == "sum":
                return {"properties": out / self.avg_num_nodes}
            return {"properties": out / data.natoms.view(-1, 1).to(out.dtype)}

    registry.register_model("est_bench_property_head")(PropertyHead)
    _PROPERTY_HEAD = PropertyHead
    return PropertyHead


def boxed(batch, cutoff: float, margin: float = 2.0):
    """A copy of ``batch`` for fairchem: molecules (no periodic direction) in a cubic periodic box.

    Box edge = largest molecular extent + 2 cutoff + margin, so no periodic
    image is within the cutoff. Periodic samples keep their cell and pbc.
    """
    b = batch.clone()
    B = int(b.natoms.numel())
    pbc = b.pbc.view(B, 3).bool() if "pbc" in b else torch.zeros(B, 3, dtype=torch.bool)
    cell = b.cell.view(B, 3, 3).to(b.pos.dtype) if "cell" in b else b.pos.new_zeros(B, 3, 3)
    mol = ~pbc.any(dim=1)  # [B]
    if bool(mol.any()):
        if not bool(mol.all()):
            raise ValueError("fairchem batches need one pbc setting for all structures; batch molecules and crystals separately")
        lo = torch.full((B, 3), float("inf"), dtype=b.pos.dtype, device=b.pos.device)
        hi = -lo
        lo = lo.scatter_reduce(0, b.batch[:, None].expand(-1, 3), b.pos, "amin")
        hi = hi.scatter_reduce(0, b.batch[:, None].expand(-1, 3), b.pos, "amax")
        edge = float((hi - lo).max()) + 2 * cutoff + margin
        cell = torch.eye(3, dtype=b.pos.dtype, device=b.pos.device).expand(B, 3, 3) * edge
        pbc = torch.ones(B, 3, dtype=torch.bool, device=b.pos.device)
    b.cell = cell.contiguous()
    b.pbc = pbc
    b.atomic_numbers = b.atomic_numbers.long()
    b.natoms = b.natoms.view(-1).long()
    return b


class FairchemModel(nn.Module):
    """fairchem's EquiformerV2 in our contract: ``model(batch) -> {"energy" [B], "forces" [N, 3]}``.

    ``boxed`` conversion happens inside ``forward`` (it is cheap: a clone and
    a few reductions) so timings include it as est's include its graph build.
    """

    def __init__(self, cfg) -> None:
        super().__init__()
        self.config = cfg
        self.model = build_fairchem(cfg)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, batch) -> dict[str, torch.Tensor]:
        data = boxed(batch, self.config.cutoff)
        bb = self.model.backbone
        if data.pos.dtype == torch.float32:
            out = self.model(data)
        else:
            # fairchem's radius_graph_pbc hard-codes float32 image offsets: select the edges on a
            # float32 copy (topology only) and let the model compute distances in data.pos's dtype
            from fairchem.core.common.utils import radius_graph_pbc

            d32 = data.clone()
            d32.pos, d32.cell = data.pos.float(), data.cell.float()
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
            try:
                data.edge_index, data.cell_offsets, data.neighbors = radius_graph_pbc(
                    d32, self.config.cutoff, int(self.config.max_neighbors), bb.enforce_max_neighbors_strictly)
            finally:
                torch.set_default_dtype(previous)
            data.cell_offsets = data.cell_offsets.to(data.pos.dtype)
            bb.otf_graph, self.model.otf_graph = False, False
            try:
                out = self.model(data)
            finally:
                bb.otf_graph, self.model.otf_graph = True, True
        result = {}
        if "energy" in out:
            result["energy"] = out["energy"]["energy"].view(-1)  # [B]
        if "forces" in out:
            result["forces"] = out["forces"]["forces"].view(-1, 3)  # [N, 3]
        if "properties" in out:
            result["properties"] = out["properties"]["properties"]  # [B, T]
        return result


def trainable(*, name: str, **overrides) -> FairchemModel:
    """``model._target_`` factory for est's trainer: fairchem's EquiformerV2 at ``comparable_config(name, **overrides)``.

    ``python train.py ... model._target_=fairchem_eqv2.trainable model.name=eqv2-tiny``
    (with ``benchmarks/baseline`` on ``sys.path``, in the baseline venv).
    """
    if not available():
        raise RuntimeError(unavailable_reason())
    return FairchemModel(comparable_config(name, **overrides))


def redrawn(*, name: str, redraw_offset: int = 1000, **overrides) -> FairchemModel:
    """``model._target_`` factory: fairchem's EquiformerV2 as :func:`trainable`, but its initial weights
    drawn with seed ``torch.initial_seed() + redraw_offset``.

    The random state after the build is the one :func:`trainable` leaves for the run's seed, so the
    data order is that seed's: paired with fairchem's run of the seed, only the initial draw differs.
    The yardstick for est's own draw (``est-ffn`` vs fairchem): how far the draw alone moves fairchem.
    """
    trainable(name=name, **overrides)  # advances the random state exactly as fairchem's run of this seed
    state = torch.random.get_rng_state()
    torch.manual_seed(torch.initial_seed() + redraw_offset)
    model = trainable(name=name, **overrides)
    torch.random.set_rng_state(state)
    return model


def est_twin(*, name: str, **overrides) -> nn.Module:
    """``model._target_`` factory: est's EquiformerV2 at ``comparable_config(name, **overrides)`` starting
    from the very weights :func:`trainable` draws for the same seed (:func:`fairchem_to_est`).

    The random state after the build is the one :func:`trainable` leaves, so with the same seed
    the data order matches too: a run of the twin differs from fairchem's run of that seed only
    in the code that computes and trains the model, not in the initial draw (training parity).
    """
    from est.models import EquiformerV2

    theirs = trainable(name=name, **overrides)
    state = torch.random.get_rng_state()
    ours = EquiformerV2(theirs.config)
    torch.random.set_rng_state(state)
    fairchem_to_est(theirs.model, ours)
    return ours


#: fairchem parameter name -> est parameter name (applied in order)
RENAMES: list[tuple[str, str]] = [
    (r"^model\.", ""),
    (r"^backbone\.sphere_embedding\.", "backbone.atom_embedding."),
    (r"^backbone\.edge_degree_embedding\.", "backbone.edge_degree."),
    (r"^output_heads\.energy\.energy_block\.", "energy_head.ffn."),
    (r"^output_heads\.forces\.force_block\.", "force_head.attention."),
    (r"^backbone\.blocks\.(\d+)\.norm_1\.", r"backbone.attention_blocks.\1.norm."),
    (r"^backbone\.blocks\.(\d+)\.ga\.", r"backbone.attention_blocks.\1.attention."),
    (r"^backbone\.blocks\.(\d+)\.norm_2\.", r"backbone.update_blocks.\1.ffns.0.norm."),
    (r"^backbone\.blocks\.(\d+)\.ffn\.", r"backbone.update_blocks.\1.ffns.0."),
    (r"^backbone\.norm\.", "backbone.final_norm."),
    (r"\.affine_weight$", ".weight"),
    (r"\.affine_bias$", ".bias"),
    (r"\.(source|target)_embedding\.", r".elements.\1."),
    (r"\.rad_func\.net\.", ".radial."),
    (r"\.so2_m_conv\.(\d+)\.fc\.", r".fc_m.\1."),
    (r"\.so3_linear_1\.", ".linear_in."),
    (r"\.so3_linear_2\.", ".linear_out."),
    (r"\.scalar_mlp\.", ".scalar."),
]


def est_name(name: str) -> str:
    for pattern, repl in RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def fairchem_to_est(fairchem_model, est_model) -> None:
    """Copy every fairchem parameter into the est parameter of the mapped name (shapes must agree)."""
    theirs = {est_name(n): p for n, p in fairchem_model.named_parameters()}
    ours = dict(est_model.named_parameters())
    missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if missing or extra:
        raise KeyError(f"parameter names do not map: est-only {missing[:5]}, fairchem-only {extra[:5]}")
    with torch.no_grad():
        for name, p in ours.items():
            if p.shape != theirs[name].shape:
                raise ValueError(f"{name}: est {tuple(p.shape)} vs fairchem {tuple(theirs[name].shape)}")
            p.copy_(theirs[name])


def fairchem_callable(model: FairchemModel):
    """``fn(positions [n, 3], numbers [n], cell [3, 3] | None, pbc [3]) -> dict`` (one structure)."""
    from torch_geometric.data import Batch, Data

    def fn(positions, numbers, cell, pbc):
        # fairchem allocates some tensors (radius_graph_pbc's unit cells) in the default dtype:
        # float64 inputs only run with float64 as the default dtype
        previous = torch.get_default_dtype()
        torch.set_default_dtype(positions.dtype if positions.dtype in (torch.float32, torch.float64) else previous)
        try:
            return _call(positions, numbers, cell, pbc)
        finally:
            torch.set_default_dtype(previous)

    def _call(positions, numbers, cell, pbc):
        n = positions.shape[0]
        cell = positions.new_zeros(3, 3) if cell is None else cell.to(positions.dtype)
        pbc = torch.zeros(3, dtype=torch.bool) if pbc is None else torch.as_tensor(pbc).bool().view(3)
        data = Data(pos=positions, atomic_numbers=torch.as_tensor(numbers).long(), natoms=torch.tensor([n]),
                    cell=cell.reshape(1, 3, 3), pbc=pbc.reshape(1, 3),
                    fixed=torch.zeros(n, dtype=torch.long), tags=torch.zeros(n, dtype=torch.long))
        out = model(Batch.from_data_list([data]))
        return {k: v[0] if k in ("energy", "properties") else v for k, v in out.items()}  # one graph

    fn.__name__ = "fairchem_EquiformerV2"
    return fn

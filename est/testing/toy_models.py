r"""Small reference models with known symmetries, and planted defects.

They exist to test the checks themselves (and to show what a failing report
looks like); they are not physical models.

:class:`MorsePotential` follows the est model contract, ``model(batch) ->
{"energy" [B], "forces" [N, 3], "properties" [B, 1], "stress" [B, 3, 3]}``:

.. math::
    E = \sum_{i<j} \epsilon_{ij} \left[(1 - e^{-a (r_{ij} - r_0)})^2 - 1\right] f_c(r_{ij}),
    \qquad f_c(r) = \tfrac12 \left(\cos\frac{\pi r}{r_c} + 1\right),

over the pairs of :func:`est.geometry.radius_graph` (periodic images
included), ``epsilon_ij = sqrt(eps_i eps_j)`` with ``eps_Z = 1 + 0.1 Z``;
``forces = -dE/dpos``, ``stress = (1/V) dE/d strain``; ``properties`` is the
coordination number ``sum f_c``. ``defect=`` plants one symmetry bug:

=======================  =====================================================
defect                   what breaks
=======================  =====================================================
``"absolute_position"``  adds ``0.05 sum_i sin(x_i + 2 y_i)``: translation, rotation
``"symmetry_break"``     adds ``1e-4 sum_pairs (r_ij . e_x)^2 / r_c^2``: rotation at 1e-4
``"permutation"``        weights atom ``i``'s energy by ``1 + 0.1 i / n``
``"no_images"``          builds the graph without periodic images
``"chiral"``             adds a pseudoscalar (triple products): reflection only
=======================  =====================================================
"""
from __future__ import annotations

import math
from typing import Any

import torch

from est.geometry import apply_strain, radius_graph

from ._cast import default_dtype

__all__ = ["MorsePotential", "morse_potential", "morse_callable", "e3nn_potential", "DEFECTS", "example_molecule", "example_crystal"]

DEFECTS = (None, "absolute_position", "symmetry_break", "permutation", "no_images", "chiral")


class MorsePotential(torch.nn.Module):
    """Pair potential following the est model contract (see the module docstring).

    Args:
        cutoff: ``r_c`` (Angstrom). r0, a: Morse minimum and width.
        defect: one of :data:`DEFECTS`. stress: also return the stress for periodic graphs.
    """

    def __init__(self, *, cutoff: float = 4.0, r0: float = 1.6, a: float = 1.3, defect: str | None = None, stress: bool = True) -> None:
        super().__init__()
        if defect not in DEFECTS:
            raise ValueError(f"unknown defect {defect!r}; expected one of {DEFECTS}")
        self.cutoff, self.r0, self.defect, self.stress = cutoff, r0, defect, stress
        self.a = torch.nn.Parameter(torch.tensor(a))  # a parameter so .double() / dtype inference work

    def energy_terms(self, pos: torch.Tensor, z: torch.Tensor, batch: torch.Tensor, cell: torch.Tensor | None, pbc: torch.Tensor | None, num_graphs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-graph energy [B] and coordination [B]."""
        use_cell = cell if (self.defect != "no_images" and pbc is not None and bool(pbc.any())) else None
        g = radius_graph(pos, self.cutoff, batch, cell=use_cell, pbc=pbc if use_cell is not None else None)
        src, dst = g.edge_index  # [E], [E]
        r = g.edge_len  # [E]
        fc = 0.5 * (torch.cos(math.pi * r / self.cutoff) + 1)  # [E]
        eps = 1.0 + 0.1 * z.to(pos.dtype)  # [N]
        eij = torch.sqrt(eps[src] * eps[dst])  # [E]
        pair = eij * ((1 - torch.exp(-self.a * (r - self.r0))) ** 2 - 1) * fc  # [E]
        if self.defect == "symmetry_break":
            pair = pair + 1e-4 * (g.edge_vec[:, 0] / self.cutoff) ** 2
        atom = pos.new_zeros(pos.shape[0]).index_add(0, dst, 0.5 * pair)  # [N]
        if self.defect == "absolute_position":
            atom = atom + 0.05 * torch.sin(pos[:, 0] + 2 * pos[:, 1])
        if self.defect == "permutation":
            first = torch.zeros(num_graphs, dtype=torch.long, device=pos.device).scatter_reduce(
                0, batch, torch.arange(pos.shape[0], device=pos.device), "amin", include_self=False
            )
            counts = torch.bincount(batch, minlength=num_graphs)
            local = torch.arange(pos.shape[0], device=pos.device) - first[batch]
            atom = atom * (1 + 0.1 * local.to(pos.dtype) / counts[batch].to(pos.dtype))
        if self.defect == "chiral":
            atom = atom + 0.1 * _chiral_term(g.edge_vec, dst, pos.shape[0])
        energy = pos.new_zeros(num_graphs).index_add(0, batch, atom)  # [B]
        coord = pos.new_zeros(num_graphs).index_add(0, batch[dst], fc)  # [B]
        return energy, coord

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        pos = batch.pos
        B = int(batch.natoms.numel())
        b = batch.batch if getattr(batch, "batch", None) is not None else torch.zeros(pos.shape[0], dtype=torch.long)
        cell = batch.cell.to(pos.dtype) if getattr(batch, "cell", None) is not None else None
        pbc = batch.pbc if getattr(batch, "pbc", None) is not None else None
        periodic = pbc is not None and bool(pbc.any())
        with torch.enable_grad():
            pos = pos.detach().requires_grad_(True)
            want_stress = self.stress and periodic and cell is not None and bool((torch.linalg.det(cell).abs() > 0).all())
            if want_stress:
                pos_s, cell_s, disp = apply_strain(pos, cell, b)
            else:
                pos_s, cell_s, disp = pos, cell, None
            energy, coord = self.energy_terms(pos_s, batch.atomic_numbers, b, cell_s, pbc, B)
            inputs = [pos] + ([disp] if disp is not None else [])
            grads = torch.autograd.grad(energy.sum(), inputs, create_graph=self.training)
        out = {"energy": energy, "forces": -grads[0], "properties": coord[:, None]}
        if disp is not None:
            vol = torch.linalg.det(cell).abs()
            out["stress"] = grads[1] / vol[:, None, None]
        return out


def _chiral_term(edge_vec: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    """Per-atom pseudoscalar ``sum_{e1,e2,e3 at i} w det(v1, v2, v3)``, ``w = exp(-(|v1| + 2|v2| + 3|v3|) / 5)``."""
    out = edge_vec.new_zeros(n)
    for i in range(n):
        v = edge_vec[dst == i]  # [k, 3]
        if v.shape[0] < 3:
            continue
        d = v.norm(dim=-1)
        cross = torch.cross(v[:, None, :].expand(-1, v.shape[0], -1), v[None, :, :].expand(v.shape[0], -1, -1), dim=-1)  # [k, k, 3]
        trip = torch.einsum("abx,cx->abc", cross, v)  # [k, k, k] det(v_a, v_b, v_c)
        w = torch.exp(-0.2 * (d[:, None, None] + 2 * d[None, :, None] + 3 * d[None, None, :]))
        out = out.index_put((torch.tensor([i]),), (w * trip).sum().reshape(1), accumulate=True)
    return out


def morse_potential(**kwargs: Any) -> MorsePotential:
    """Factory for the CLI (``--factory est.testing.toy_models:morse_potential``): a float64 MorsePotential."""
    return MorsePotential(**kwargs).double()


def morse_callable(*, defect: str | None = None, cutoff: float = 4.0):
    """The same potential as a plain callable ``(positions, numbers, cell, pbc) -> dict`` (adapter path)."""
    model = MorsePotential(defect=defect, cutoff=cutoff).double()

    def fn(positions, numbers, cell, pbc):
        dtype = positions.dtype
        m = model.to(dtype)
        b = torch.zeros(positions.shape[0], dtype=torch.long)
        with torch.enable_grad():
            p = positions.detach().requires_grad_(True)
            c = None if cell is None else cell[None]
            e, _ = m.energy_terms(p, numbers, b, c, pbc[None] if c is not None else None, 1)
            (g,) = torch.autograd.grad(e.sum(), p)
        return {"energy": e[0], "forces": -g}

    return fn


def e3nn_potential(*, lmax: int = 2, cutoff: float = 4.0, seed: int = 0, dtype: torch.dtype = torch.float64):
    """A small e3nn model as a callable ``(positions, numbers, cell, pbc) -> {"energy", "forces", "dipole"}``.

    Node features ``h_i = sum_j R(r_ij) Y(r_ij)`` (irreps ``0e + 1o + ... lmax``,
    e3nn's spherical harmonics), scalars from ``FullyConnectedTensorProduct(h, h)``,
    energy = sum of a readout; ``dipole`` = the summed ``1o`` output of the tensor product (a vector output). Equivariant under O(3) (molecules and cells).
    """
    from e3nn import o3

    with default_dtype(dtype):
        torch.manual_seed(seed)
        irreps_sh = o3.Irreps.spherical_harmonics(lmax)
        tp = o3.FullyConnectedTensorProduct(irreps_sh, irreps_sh, "4x0e + 1x1o")
        w_radial = torch.randn(lmax + 1, 3)

    def fn(positions, numbers, cell, pbc):
        with torch.enable_grad():
            p = positions.detach().to(dtype).requires_grad_(True)
            c = None if cell is None else cell.to(dtype)[None]
            g = radius_graph(p, cutoff, cell=c, pbc=pbc[None] if c is not None else None)
            src, dst = g.edge_index
            sh = o3.spherical_harmonics(irreps_sh, g.edge_vec, normalize=True)  # [E, K]
            r = g.edge_len[:, None]
            basis = torch.cat([torch.exp(-r), torch.exp(-2 * r), torch.exp(-0.5 * r)], dim=1)  # [E, 3]
            fc = 0.5 * (torch.cos(math.pi * r / cutoff) + 1)  # [E, 1]
            radial = (basis @ w_radial.T) * fc  # [E, L+1]
            per_l = torch.cat([radial[:, l : l + 1].expand(-1, 2 * l + 1) for l in range(lmax + 1)], dim=1)  # [E, K]
            z = 1.0 + 0.1 * numbers.to(dtype)[src, None]
            h = p.new_zeros(p.shape[0], sh.shape[1]).index_add(0, dst, sh * per_l * z)  # [N, K]
            out = tp(h, h)  # [N, 4 + 3]
            energy = out[:, :4].sum()
            (grad,) = torch.autograd.grad(energy, p)
        return {"energy": energy.detach(), "forces": -grad, "dipole": out[:, 4:].sum(0).detach()}

    return fn


def example_molecule(n: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random, well separated molecule ``{"pos", "atomic_numbers"}`` (Angstrom)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.zeros(0, 3, dtype=torch.float64)
    while pos.shape[0] < n:
        c = torch.randn(1, 3, generator=g, dtype=torch.float64) * 1.4
        if pos.shape[0] == 0 or float(torch.cdist(c, pos).min()) > 1.0:
            pos = torch.cat([pos, c])
    z = torch.tensor([1, 6, 7, 8, 1, 6, 6, 8, 1, 1])[torch.arange(n) % 10]
    return {"pos": pos, "atomic_numbers": z}


def example_crystal(seed: int = 0, *, pbc: tuple[bool, bool, bool] = (True, True, True)) -> dict[str, torch.Tensor]:
    """A small triclinic cell with 4 atoms ``{"pos", "atomic_numbers", "cell", "pbc"}`` (cell smaller than twice the cutoff)."""
    g = torch.Generator().manual_seed(seed)
    cell = torch.tensor([[3.1, 0.0, 0.0], [0.6, 3.3, 0.0], [0.4, -0.3, 3.6]], dtype=torch.float64)
    frac = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]], dtype=torch.float64)
    frac = frac + 0.05 * torch.randn(4, 3, generator=g, dtype=torch.float64)
    if not pbc[2]:
        cell[2] = torch.tensor([0.0, 0.0, 12.0], dtype=torch.float64)
    return {"pos": frac @ cell, "atomic_numbers": torch.tensor([29, 29, 8, 1]), "cell": cell, "pbc": torch.tensor(pbc)}

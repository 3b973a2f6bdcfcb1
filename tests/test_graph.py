"""Tests for est.geometry: radius graph (molecules, periodic, partial pbc,
max_neighbors tie handling), validation errors, edge frames, strain/stress."""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111, molecule
from ase.neighborlist import neighbor_list

from est.geometry import (
    Graph,
    apply_strain,
    cell_volume,
    edge_rotation,
    radius_graph,
    stress_from_energy,
)

DT = torch.float64


def _t(x, dtype=DT):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def _edge_set(g: Graph):
    src, tgt = g.edge_index.tolist()
    return set(zip(tgt, src, map(tuple, g.cell_offsets.tolist())))


def _ase_set(atoms, cutoff, offset=0):
    i, j, S = neighbor_list("ijS", atoms, cutoff)
    return set(zip((i + offset).tolist(), (j + offset).tolist(), map(tuple, S.tolist())))


def _brute_molecule(pos, cutoff):
    d = np.linalg.norm(pos[None] - pos[:, None], axis=-1)
    i, j = np.nonzero((d < cutoff) & ~np.eye(len(pos), dtype=bool))
    return set(zip(i.tolist(), j.tolist(), [(0, 0, 0)] * len(i)))


def _check_graph_consistency(g, pos, cell, batch):
    src, tgt = g.edge_index
    vec = pos[src] - pos[tgt]
    if cell is not None:
        vec = vec + torch.einsum("ek,ekl->el", g.cell_offsets.to(pos.dtype), cell[batch[tgt]])
    torch.testing.assert_close(g.edge_vec, vec)
    torch.testing.assert_close(g.edge_len, vec.norm(dim=-1))
    assert g.cell_offsets.dtype == torch.long
    assert bool((tgt[1:] >= tgt[:-1]).all()), "edges must be sorted by target"


# --------------------------------------------------------------------------
# molecules
# --------------------------------------------------------------------------
def test_molecules_match_bruteforce():
    rng = np.random.default_rng(0)
    sizes = [1, 2, 5, 29, 17, 3, 60, 9]
    pos = [rng.uniform(-3, 3, size=(n, 3)) * (n / 10) ** (1 / 3) for n in sizes]
    ref, off = set(), 0
    for p in pos:
        ref |= {(i + off, j + off, s) for i, j, s in _brute_molecule(p, 2.5)}
        off += len(p)
    P = _t(np.concatenate(pos))
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    g = radius_graph(P, cutoff=2.5, batch=batch)
    assert _edge_set(g) == ref
    _check_graph_consistency(g, P, None, batch)
    # messages flow source -> target, no self loops
    assert not bool((g.edge_index[0] == g.edge_index[1]).any())


def test_molecule_keyword_and_positional_cutoff():
    m = molecule("CH3CH2OH")
    P = _t(m.positions)
    a = radius_graph(P, 3.0)
    b = radius_graph(P, cutoff=3.0, batch=None)
    assert torch.equal(a.edge_index, b.edge_index)


def test_permutation_invariance_of_edge_set():
    rng = np.random.default_rng(1)
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 1))
    atoms.rattle(0.1, seed=3)
    P, C = _t(atoms.positions), _t(np.array(atoms.cell))[None]
    perm = torch.as_tensor(rng.permutation(len(atoms)))
    g1 = radius_graph(P, 5.0, cell=C, pbc=torch.tensor([[True] * 3]))
    g2 = radius_graph(P[perm], 5.0, cell=C, pbc=torch.tensor([[True] * 3]))
    src, tgt = perm[g2.edge_index[0]].tolist(), perm[g2.edge_index[1]].tolist()
    # map back: g2 atom a is g1 atom perm[a]
    assert set(zip(tgt, src, map(tuple, g2.cell_offsets.tolist()))) == _edge_set(g1)


# --------------------------------------------------------------------------
# periodic cells vs ase.neighborlist
# --------------------------------------------------------------------------
def _periodic_cases():
    slab = fcc111("Cu", (3, 3, 3), vacuum=5.0)  # pbc (T, T, F)
    slab.rattle(0.05, seed=1)
    tri = Atoms(
        "CuAgH",
        scaled_positions=[[0.1, 0.2, 0.3], [0.6, 0.5, 0.9], [0.35, 0.8, 0.55]],
        cell=[[2.1, 0.2, 0.1], [0.9, 2.3, -0.3], [0.4, -0.6, 2.6]],  # triclinic, far smaller than cutoff
        pbc=True,
    )
    wire = Atoms("Cu2", positions=[[0, 0, 0], [1.3, 1.0, 0.4]], cell=[[2.4, 0.3, 0], [0, 5, 0], [0, 0, 5]],
                 pbc=[True, False, False])
    unwrapped = bulk("NaCl", "rocksalt", a=5.6).repeat((1, 2, 1))
    unwrapped.positions += np.array([[7.0, -3.0, 11.0], [-9.5, 2.0, 0.3], [0.2, 13.0, -4.0], [1.0, 1.0, 1.0]])
    return [slab, tri, wire, unwrapped]


def _batched(cases, cutoff, dtype=DT):
    """Structures as one batch: positions [N, 3], cells [B, 3, 3] (zero for a molecule), pbc [B, 3],
    batch [N], and ASE's edge set at ``cutoff`` with atom indices offset per structure."""
    pos, cells, pbcs, ref, off = [], [], [], set(), 0
    for a in cases:
        ref |= _ase_set(a, cutoff, off)
        off += len(a)
        pos.append(a.positions)
        cells.append(np.array(a.cell) if a.pbc.any() else np.zeros((3, 3)))
        pbcs.append(a.pbc)
    batch = torch.repeat_interleave(torch.arange(len(cases)), torch.tensor([len(a) for a in cases]))
    return _t(np.concatenate(pos), dtype), _t(np.stack(cells), dtype), torch.tensor(np.stack(pbcs)), batch, ref


@pytest.mark.parametrize("case", range(4))
def test_periodic_matches_ase(case):
    atoms = _periodic_cases()[case]
    cutoff = 4.5
    P, C = _t(atoms.positions), _t(np.array(atoms.cell))[None]
    g = radius_graph(P, cutoff, cell=C, pbc=torch.tensor(atoms.pbc)[None])
    assert _edge_set(g) == _ase_set(atoms, cutoff)
    _check_graph_consistency(g, P, C, torch.zeros(len(atoms), dtype=torch.long))


def test_mixed_batch_matches_ase_float32():
    mol = molecule("C6H6")
    P, C, pbc, batch, ref = _batched([mol] + _periodic_cases(), 4.0, torch.float32)
    g = radius_graph(P, 4.0, batch=batch, cell=C, pbc=pbc)
    assert _edge_set(g) == ref
    _check_graph_consistency(g, P, C, batch)
    # pbc inferred from the cell: zero cell = molecule, non-zero rows periodic
    g2 = radius_graph(P[: len(mol)], 4.0, cell=torch.zeros(1, 3, 3))
    assert _edge_set(g2) == _ase_set(mol, 4.0)


def test_gradients_wrt_pos_and_cell():
    atoms = _periodic_cases()[1]
    P = _t(atoms.positions).requires_grad_()
    C = _t(np.array(atoms.cell))[None].requires_grad_()

    def f(p, c):
        return radius_graph(p, 3.0, cell=c, pbc=torch.tensor([[True] * 3])).edge_len.pow(2).sum()

    assert torch.autograd.gradcheck(f, (P, C))


# --------------------------------------------------------------------------
# max_neighbors
# --------------------------------------------------------------------------
def _nbr_sets(g):
    """target -> set of (source, edge vector rounded to 1e-3)."""
    out = {}
    for (s, t), v in zip(g.edge_index.T.tolist(), np.round(g.edge_vec.detach().double().numpy(), 3).tolist()):
        out.setdefault(t, set()).add((s, tuple(v)))
    return out


def _reference_strict(atoms, cutoff, k, tol=1e-4):
    i, j, D, d = neighbor_list("ijDd", atoms, cutoff)
    out = {}
    for t in np.unique(i):
        m = i == t
        jj, DD, dd = j[m], D[m], d[m]
        if len(dd) <= k:
            keep = np.arange(len(dd))
        else:
            dk = np.sort(dd)[k - 1]
            less = np.nonzero(dd < dk - tol)[0]
            tied = np.nonzero(np.abs(dd - dk) <= tol)[0]
            key = sorted(tied, key=lambda e: (jj[e], *np.round(DD[e] / 1e-2).astype(int)))
            keep = np.concatenate([less, np.array(key[: k - len(less)], dtype=int)])
        out[int(t)] = {(int(jj[e]), tuple(np.round(DD[e], 3).tolist())) for e in keep}
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_max_neighbors_strict_matches_reference_and_is_cell_independent(dtype):
    atoms = fcc111("Cu", (2, 2, 3), vacuum=4.0, periodic=True)  # perfect crystal: many exact ties
    atoms.pbc = True
    k, cutoff = 7, 5.0
    P, C = _t(atoms.positions, dtype), _t(np.array(atoms.cell), dtype)[None]
    g = radius_graph(P, cutoff, cell=C, pbc=torch.tensor([[True] * 3]), max_neighbors=k)
    counts = torch.bincount(g.edge_index[1], minlength=len(atoms))
    assert bool((counts == k).all())
    ref = _reference_strict(atoms, cutoff, k)
    assert _nbr_sets(g) == ref

    # same crystal, cell written differently (a' = a + b, c' = c - a) and atoms wrapped into it
    a, b, c = np.array(atoms.cell)
    cell2 = np.stack([a + b, b, c - a])
    frac = np.linalg.solve(cell2.T, atoms.positions.T).T
    pos2 = (frac - np.floor(frac)) @ cell2
    g2 = radius_graph(_t(pos2, dtype), cutoff, cell=_t(cell2, dtype)[None], pbc=torch.tensor([[True] * 3]),
                      max_neighbors=k)
    assert _nbr_sets(g2) == ref


def test_max_neighbors_include_keeps_all_ties():
    atoms = bulk("Cu", "fcc", a=3.6)  # one atom: 12 nearest neighbours, all tied
    P, C = _t(atoms.positions), _t(np.array(atoms.cell))[None]
    pbc = torch.tensor([[True] * 3])
    strict = radius_graph(P, 4.0, cell=C, pbc=pbc, max_neighbors=5)
    incl = radius_graph(P, 4.0, cell=C, pbc=pbc, max_neighbors=5, tie_mode="include")
    assert strict.edge_index.shape[1] == 5
    assert incl.edge_index.shape[1] == 12
    full = radius_graph(P, 4.0, cell=C, pbc=pbc)
    assert full.edge_index.shape[1] == 18  # 12 + 6 second shell
    # strict keeps the canonical (lexicographically first) tied vectors
    v = np.round(strict.edge_vec.numpy() / 1e-2).astype(int).tolist()
    allv = sorted(np.round(incl.edge_vec.numpy() / 1e-2).astype(int).tolist())
    assert sorted(v) == allv[:5]


def test_max_neighbors_random_molecules():
    rng = np.random.default_rng(5)
    pos = rng.uniform(0, 4, size=(40, 3))
    P = _t(pos)
    g = radius_graph(P, 3.0, max_neighbors=6)
    d = np.linalg.norm(pos[None] - pos[:, None], axis=-1)
    np.fill_diagonal(d, np.inf)
    for t in range(40):
        cand = np.nonzero(d[t] < 3.0)[0]
        expect = set(cand[np.argsort(d[t, cand])][:6].tolist())
        got = set(g.edge_index[0, g.edge_index[1] == t].tolist())
        assert got == expect


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------
def test_errors():
    P = torch.rand(5, 3, dtype=DT) * 3
    bad = P.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="atom 3"):
        radius_graph(bad, 2.0)
    bad[3, 1] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        radius_graph(bad, 2.0)
    dup = torch.cat([P, P[2:3] + 1e-6])
    with pytest.raises(ValueError, match=r"atoms 5 and 2 of graph 1|atoms 2 and 5 of graph 1"):
        radius_graph(dup, 2.0, batch=torch.tensor([0, 1, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="empty"):
        radius_graph(torch.zeros(0, 3), 2.0)
    with pytest.raises(ValueError, match="batch has shape"):
        radius_graph(P, 2.0, batch=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="sorted"):
        radius_graph(P, 2.0, batch=torch.tensor([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError, match="refers to graph 1000000000000 but there are only 5 atoms"):
        radius_graph(P, 2.0, batch=torch.tensor([0, 0, 0, 0, 10**12]))  # refused before allocating 1e12 counters
    with pytest.raises(ValueError, match="graph 1 has no atoms"):
        radius_graph(P, 2.0, batch=torch.tensor([0, 0, 2, 2, 2]))
    sing = torch.tensor([[[3.0, 0, 0], [6.0, 0, 0], [0, 0, 3.0]]], dtype=DT)
    with pytest.raises(ValueError, match="singular"):
        radius_graph(P, 2.0, cell=sing, pbc=torch.tensor([[True, True, True]]))
    with pytest.raises(ValueError, match="singular"):
        radius_graph(P, 2.0, cell=torch.zeros(1, 3, 3, dtype=DT), pbc=torch.tensor([[True, True, False]]))
    with pytest.raises(ValueError, match="no cell"):
        radius_graph(P, 2.0, pbc=torch.tensor([[True, False, False]]))
    with pytest.raises(ValueError, match="tie_mode"):
        radius_graph(P, 2.0, max_neighbors=3, tie_mode="arbitrary")
    # an atom on top of its own periodic image (cell vector ~0) is caught too
    with pytest.raises(ValueError):
        radius_graph(P[:1], 2.0, cell=torch.tensor([[[1e-5, 0, 0], [0, 3.0, 0], [0, 0, 3.0]]], dtype=DT),
                     pbc=torch.tensor([[True] * 3]))
    # a singular cell is fine for a molecule in a mixed batch
    g = radius_graph(P, 2.0, batch=torch.tensor([0, 0, 0, 1, 1]),
                     cell=torch.stack([torch.zeros(3, 3, dtype=DT), 5 * torch.eye(3, dtype=DT)]),
                     pbc=torch.tensor([[False] * 3, [True] * 3]))
    assert g.edge_index.shape[0] == 2
    # ... and so is a garbage (NaN) cell of a non-periodic graph
    g2 = radius_graph(P, 2.0, batch=torch.tensor([0, 0, 0, 1, 1]),
                      cell=torch.stack([torch.full((3, 3), float("nan"), dtype=DT), 5 * torch.eye(3, dtype=DT)]),
                      pbc=torch.tensor([[False] * 3, [True] * 3]))
    assert torch.equal(g2.edge_index, g.edge_index) and torch.isfinite(g2.edge_vec).all()


def test_isolated_atom_has_no_edges():
    P = torch.tensor([[0.0, 0, 0], [10.0, 0, 0], [11.0, 0, 0]])
    g = radius_graph(P, 2.0)
    assert sorted(g.edge_index[1].tolist()) == [1, 2]


# --------------------------------------------------------------------------
# edge frames
# --------------------------------------------------------------------------
def test_edge_rotation_properties():
    torch.manual_seed(0)
    v = torch.randn(500, 3, dtype=DT)
    poles = torch.tensor([[0, 1, 0], [0, -1, 0], [0, 2.5, 0], [0, -0.3, 0], [1e-9, -1, 0], [0, 0.9, 0.436]],
                         dtype=DT)
    v = torch.cat([v, poles])
    R = edge_rotation(v)
    u = v / v.norm(dim=-1, keepdim=True)
    eye = torch.eye(3, dtype=DT).expand_as(R)
    torch.testing.assert_close(R @ R.transpose(1, 2), eye)
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(len(v), dtype=DT))
    torch.testing.assert_close((R @ u[..., None])[..., 0], torch.tensor([0.0, 1, 0], dtype=DT).expand_as(u))
    torch.testing.assert_close(R[:, 1], u)
    torch.testing.assert_close(R[len(v) - 6], torch.eye(3, dtype=DT))  # +y -> identity
    assert torch.equal(edge_rotation(v), R)  # deterministic


def test_edge_rotation_grad_finite_at_poles():
    v = torch.tensor([[0, 1.0, 0], [0, -1.0, 0], [0, -2.0, 0], [0.3, -1.0, 0.2], [1.0, 0.2, -0.5]],
                     dtype=DT, requires_grad=True)
    R = edge_rotation(v)
    w = torch.randn(3, 3, dtype=DT)
    (g,) = torch.autograd.grad((R * w).sum(), v)
    assert torch.isfinite(g).all()
    # float32 too
    v32 = v.detach().float().requires_grad_()
    (g32,) = torch.autograd.grad(edge_rotation(v32).sum(), v32)
    assert torch.isfinite(g32).all()
    # smooth away from the chart switch: gradcheck on generic and pole-adjacent edges
    x = torch.tensor([[0.1, 1.0, -0.2], [0.3, -1.0, 0.1], [0.0, -1.0, 1e-3], [1.0, 0.0, 0.0]], dtype=DT,
                     requires_grad=True)
    assert torch.autograd.gradcheck(edge_rotation, (x,))


# --------------------------------------------------------------------------
# cell volume, strain and stress
# --------------------------------------------------------------------------
def test_cell_volume():
    c = torch.tensor([[[2.0, 0, 0], [1.0, 3.0, 0], [0.5, 0.2, 4.0]], [[0.0, 1, 0], [1, 0, 0], [0, 0, 1]]])
    torch.testing.assert_close(cell_volume(c), torch.tensor([24.0, 1.0]))


def _lj_energy(pos, cell, batch, cutoff, sigma=2.3, eps=0.01):
    g = radius_graph(pos, cutoff, batch=batch, cell=cell, pbc=torch.ones(cell.shape[0], 3, dtype=torch.bool))
    r = g.edge_len
    e0 = 4 * eps * ((sigma / cutoff) ** 12 - (sigma / cutoff) ** 6)
    pair = 4 * eps * ((sigma / r) ** 12 - (sigma / r) ** 6) - e0
    return torch.zeros(cell.shape[0], dtype=pos.dtype).index_add(0, batch[g.edge_index[1]], 0.5 * pair)


def test_forces_and_stress_match_ase_lj():
    from ase.calculators.lj import LennardJones

    atoms = _periodic_cases()[3].copy()  # unwrapped positions in a non-orthogonal fcc cell
    atoms.rattle(0.05, seed=7)
    cutoff = 6.0
    atoms.calc = LennardJones(sigma=2.3, epsilon=0.01, rc=cutoff)
    pos = _t(atoms.positions).requires_grad_()
    cell = _t(np.array(atoms.cell))[None]
    batch = torch.zeros(len(atoms), dtype=torch.long)
    pos_s, cell_s, disp = apply_strain(pos, cell, batch)
    assert torch.equal(pos_s, pos) and torch.equal(cell_s, cell)
    e = _lj_energy(pos_s, cell_s, batch, cutoff)
    forces = -torch.autograd.grad(e.sum(), pos, retain_graph=True)[0]
    stress = stress_from_energy(e, disp, cell)
    np.testing.assert_allclose(e.item(), atoms.get_potential_energy(), rtol=1e-10)
    np.testing.assert_allclose(forces.numpy(), atoms.get_forces(), atol=1e-10)
    np.testing.assert_allclose(stress[0].numpy(), atoms.get_stress(voigt=False), atol=1e-10)


def test_chunked_blocks_and_groups_match(monkeypatch):
    """Tiny block budget: targets processed in chunks, several size groups, global re-sort."""
    import est.geometry as graph_mod

    mol = molecule("C6H6")
    P, C, pbc, batch, ref = _batched([mol] + _periodic_cases() + [molecule("CH4")], 4.0)
    full = radius_graph(P, 4.0, batch=batch, cell=C, pbc=pbc, max_neighbors=9)
    monkeypatch.setattr(graph_mod, "_BLOCK_BUDGET", 64)
    g = radius_graph(P, 4.0, batch=batch, cell=C, pbc=pbc)
    assert _edge_set(g) == ref
    _check_graph_consistency(g, P, C, batch)
    small = radius_graph(P, 4.0, batch=batch, cell=C, pbc=pbc, max_neighbors=9)
    assert _edge_set(small) == _edge_set(full)

"""Geometry, below the layers: pure-torch radius graphs (molecules and periodic
cells), the rotation that takes each edge to the pole, and strain for stress.

It imports only torch, so ``est.nn`` and ``est.models`` need no data I/O
(``est.data`` re-exports :func:`radius_graph` for its users).

No pyg-lib / torch-cluster / torch-scatter: everything here is plain torch.

Conventions
-----------
* ``edge_index[0]`` is the **source** atom j, ``edge_index[1]`` the **target**
  atom i; messages flow j -> i (PyG's ``"source_to_target"``). Edges are
  sorted by target (ascending); the order within one target is deterministic
  but otherwise unspecified.
* ``edge_vec[e] = pos[j] + cell_offsets[e] @ cell[b] - pos[i]`` (the vector
  from the target to the source image), with ``cell`` holding lattice vectors
  as **rows** (ASE / OC20 convention) and ``b = batch[i]``. It is rebuilt from
  ``pos`` and ``cell`` with differentiable ops after the (non-differentiable)
  neighbour search, so ``-dE/dpos`` gives forces and the strain derivative
  (:func:`apply_strain`) gives the stress.
* ``cell_offsets`` are integer image offsets, ``torch.long`` [E, 3]; zero on
  non-periodic axes and for molecules.
* An edge exists iff ``0 < |edge_vec| < cutoff`` (strict, as in
  ``ase.neighborlist.neighbor_list``). The self pair (j == i at zero offset)
  is excluded; an atom's own periodic images at non-zero offsets are kept.
  Isolated atoms simply get no edges (documented, not an error).

Algorithm: graphs are grouped by size (greedy, bounded padding waste) and each
group is processed as one padded ``[G, n, C]`` block of squared distances
(one batched matmul in float64 on per-graph centred coordinates, absolute
error ~1e-12 A^2); nothing is ever dense over the whole batch. Periodic graphs first
wrap atoms into the cell (so unwrapped / MD positions work), then enumerate
image offsets ``|n_k| <= ceil(cutoff / h_k)`` with ``h_k`` the spacing of the
lattice planes spanned by the other two vectors (``h_a = V / |b x c|``), which
is sufficient for any triclinic cell, including cells smaller than the
cutoff. Images whose bounding box is farther than the cutoff are dropped, and
so are image atoms outside the targets' bounding box grown by the cutoff. Cost
is O(n^2 * images) per graph; memory is bounded by chunking over targets.
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    "Graph",
    "radius_graph",
    "edge_rotation",
    "cell_volume",
    "apply_strain",
    "stress_from_energy",
]

# elements of one padded distance block before we chunk over targets
_BLOCK_BUDGET = 1 << 22


class Graph(NamedTuple):
    """Result of :func:`radius_graph`.

    Attributes:
        edge_index: long [2, E]; row 0 = source j, row 1 = target i (j -> i).
        edge_vec: float [E, 3]; ``pos[j] + cell_offsets @ cell[b] - pos[i]``,
            differentiable w.r.t. ``pos`` and ``cell``.
        edge_len: float [E]; ``|edge_vec|`` (differentiable).
        cell_offsets: long [E, 3]; integer periodic image of the source.
    """

    edge_index: Tensor
    edge_vec: Tensor
    edge_len: Tensor
    cell_offsets: Tensor


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------
def _check_inputs(
    pos: Tensor, batch: Optional[Tensor], cell: Optional[Tensor], pbc: Optional[Tensor], cutoff: float
) -> Tuple[Tensor, Tensor, Tensor, int, Optional[Tensor], Tensor]:
    """Return (batch, counts, ptr, B, cell [B,3,3] | None, pbc bool [B,3])."""
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[1] != 3:
        shape = tuple(getattr(pos, "shape", ()))
        raise ValueError(f"radius_graph: pos must be a float tensor [N, 3], got shape {shape}")
    if not pos.is_floating_point():
        raise ValueError(f"radius_graph: pos must be floating point, got {pos.dtype}")
    if not (isinstance(cutoff, (int, float)) and math.isfinite(cutoff) and cutoff > 0):
        raise ValueError(f"radius_graph: cutoff must be a positive finite number, got {cutoff!r}")
    N = pos.shape[0]
    if N == 0:
        raise ValueError("radius_graph: empty input (pos has 0 atoms); filter empty samples out before batching")
    finite = torch.isfinite(pos.detach()).all(dim=1)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0, 0])
        nbad = int((~finite).sum())
        g = "" if batch is None or batch.shape[0] != N else f" (graph {int(batch[bad])})"
        raise ValueError(
            f"radius_graph: non-finite position (NaN or inf) at atom {bad}{g}: {pos[bad].tolist()}; "
            f"{nbad} atom(s) affected. Check the input structure / the integrator."
        )
    device = pos.device
    if batch is None:
        batch = torch.zeros(N, dtype=torch.long, device=device)
    else:
        if batch.dim() != 1 or batch.shape[0] != N:
            raise ValueError(
                f"radius_graph: batch has shape {tuple(batch.shape)} but pos has {N} atoms; "
                "batch must be a long tensor [N] with the graph index of every atom"
            )
        if batch.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"radius_graph: batch must be an integer tensor, got {batch.dtype}")
        batch = batch.long()
        if bool((batch < 0).any()):
            raise ValueError("radius_graph: batch contains negative graph indices")
        if N > 1 and bool((batch[1:] < batch[:-1]).any()):
            raise ValueError("radius_graph: batch must be sorted (non-decreasing), as in a PyG Batch")
    B = int(batch[-1]) + 1
    if B > N:  # checked before bincount, which would allocate B counters
        raise ValueError(
            f"radius_graph: batch refers to graph {B - 1} but there are only {N} atoms; graph indices must run "
            "0..B-1 with at least one atom per graph (as in a PyG Batch)"
        )
    if cell is not None:
        if cell.dim() == 2 and cell.shape == (3, 3):
            cell = cell.unsqueeze(0)
        if cell.dim() != 3 or cell.shape[1:] != (3, 3):
            raise ValueError(f"radius_graph: cell must be [B, 3, 3] (lattice vectors as rows), got {tuple(cell.shape)}")
        if cell.shape[0] < B:
            raise ValueError(f"radius_graph: cell has {cell.shape[0]} graphs but batch refers to {B}")
        B = cell.shape[0]
    counts = torch.bincount(batch, minlength=B)
    if bool((counts == 0).any()):
        g = int((counts == 0).nonzero()[0, 0])
        raise ValueError(f"radius_graph: graph {g} has no atoms (empty graph); drop it from the batch")
    ptr = torch.zeros(B + 1, dtype=torch.long, device=device)
    ptr[1:] = torch.cumsum(counts, 0)

    if pbc is None:
        if cell is None:
            pbc = torch.zeros(B, 3, dtype=torch.bool, device=device)
        else:  # periodic along every non-zero lattice vector (zeros = molecule, per CONVENTIONS)
            pbc = cell.detach().abs().sum(-1) > 0
    else:
        pbc = torch.as_tensor(pbc, device=device).bool()
        if pbc.dim() == 1:
            pbc = pbc.unsqueeze(0)
        if pbc.dim() != 2 or pbc.shape[1] != 3:
            raise ValueError(f"radius_graph: pbc must be bool [B, 3], got shape {tuple(pbc.shape)}")
        if pbc.shape[0] == 1 and B > 1:
            pbc = pbc.expand(B, 3)
        if pbc.shape[0] != B:
            raise ValueError(f"radius_graph: pbc has {pbc.shape[0]} graphs but there are {B}")
    if bool(pbc.any()):
        if cell is None:
            raise ValueError("radius_graph: pbc is True for some graph but no cell was given")
        per = pbc.any(1)
        cfin = torch.isfinite(cell.detach()).flatten(1).all(1)
        if bool((per & ~cfin).any()):
            g = int((per & ~cfin).nonzero()[0, 0])
            raise ValueError(f"radius_graph: cell of periodic graph {g} contains NaN/inf")
    return batch, counts, ptr, B, cell, pbc


def _completed_cells(cell: Tensor, pbc: Tensor, gids: Tensor) -> Tensor:
    """float64 [P, 3, 3]: cells of periodic graphs ``gids`` whose non-periodic rows
    are replaced by unit vectors completing the periodic ones (only used to count
    images and to wrap; images are only ever taken along periodic rows)."""
    M = cell.detach()[gids].double().clone()
    p = pbc[gids]
    npp = p.sum(1)
    two = (npp == 2).nonzero().flatten()
    if two.numel():
        k = (~p[two]).long().argmax(1)
        r1 = M[two, (k + 1) % 3]
        r2 = M[two, (k + 2) % 3]
        n = torch.linalg.cross(r1, r2)
        M[two, k] = n / n.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    for g in (npp == 1).nonzero().flatten().tolist():  # rare: wires
        k = int(p[g].long().argmax())
        a = M[g, k] / M[g, k].norm().clamp_min(1e-300)
        e = torch.zeros(3, dtype=M.dtype, device=M.device)
        e[int(a.abs().argmin())] = 1.0
        u1 = torch.linalg.cross(a, e)
        u1 = u1 / u1.norm()
        u2 = torch.linalg.cross(a, u1)
        M[g, (k + 1) % 3] = u1
        M[g, (k + 2) % 3] = u2
    return M


# --------------------------------------------------------------------------
# neighbour search
# --------------------------------------------------------------------------
def _plan_groups(counts: List[int], nimg: List[int]) -> List[List[int]]:
    """Greedy grouping of graphs into padded blocks with bounded waste."""
    order = sorted(range(len(counts)), key=lambda g: (nimg[g] * counts[g] * counts[g], counts[g]), reverse=True)
    groups: List[List[int]] = []
    cur: List[int] = []
    nmax = smax = 0
    actual = 0
    for g in order:
        n, s = counts[g], nimg[g]
        if cur:
            nn, ss = max(nmax, n), max(smax, s)
            padded = (len(cur) + 1) * nn * nn * ss
            if padded <= 2 * (actual + n * n * s) + 65536:
                cur.append(g)
                nmax, smax, actual = nn, ss, actual + n * n * s
                continue
            groups.append(cur)
        cur, nmax, smax, actual = [g], n, s, n * n * s
    if cur:
        groups.append(cur)
    return sorted(sorted(g) for g in groups)


def _select_sparse(
    row: Tensor,
    d: Tensor,
    nrows: int,
    rel,
    src: Tensor,
    max_neighbors: int,
    tie_mode: str,
    tie_tol: float,
) -> Optional[Tensor]:
    """Keep-mask for candidate edges (all within the cutoff) sorted by ``row``
    (one row per target). Returns None when nothing is dropped.

    ``d`` [E] distances, ``rel(sel)`` the Cartesian edge vectors of edges
    ``sel`` and ``src`` [E] source atoms (the last two only break exact ties
    in ``"strict"`` mode).
    """
    k = max_neighbors
    cnt = torch.bincount(row, minlength=nrows)  # [R]
    if int(cnt.max()) <= k:
        return None
    start = torch.cumsum(cnt, 0) - cnt
    slot = torch.arange(row.numel(), device=d.device) - start.index_select(0, row)
    D = torch.full((nrows, int(cnt.max())), float("inf"), dtype=d.dtype, device=d.device)  # [R, maxdeg]
    D[row, slot] = d
    dk = D.topk(k, dim=1, largest=False, sorted=False).values.amax(1).index_select(0, row)  # [E] k-th smallest
    if tie_mode == "include":
        return d <= dk + tie_tol
    less = d < dk - tie_tol
    tied = (d - dk).abs() <= tie_tol
    need = k - torch.bincount(row, weights=less.to(d.dtype), minlength=nrows).round().long()  # [R]
    amb = torch.bincount(row, weights=tied.to(d.dtype), minlength=nrows).round().long() > need  # ties to break
    keep = less | tied
    if not bool(amb.any()):
        return keep
    sel = (tied & amb.index_select(0, row)).nonzero().flatten()
    if sel.numel():
        v = torch.round(rel(sel).double() / 1e-2).long()  # [A, 3] Cartesian vector on a 0.01 A grid
        r = row[sel]
        perm = torch.arange(sel.numel(), device=d.device)
        for key in (v[:, 2], v[:, 1], v[:, 0], src[sel], r):  # least significant first
            perm = perm[torch.sort(key[perm], stable=True).indices]
        rs = r[perm]
        first = torch.ones_like(rs, dtype=torch.bool)
        first[1:] = rs[1:] != rs[:-1]
        ar = torch.arange(rs.numel(), device=d.device)
        rank = ar - torch.cummax(torch.where(first, ar, 0), 0).values
        keep[sel[perm[rank >= need[rs]]]] = False
    return keep


def radius_graph(
    pos: Tensor,
    cutoff: float,
    batch: Optional[Tensor] = None,
    cell: Optional[Tensor] = None,
    pbc: Optional[Tensor] = None,
    max_neighbors: Optional[int] = None,
    *,
    tie_mode: str = "strict",
    tie_tol: float = 1e-4,
    min_dist: float = 1e-4,
) -> Graph:
    """Radius graph with periodic images, in pure torch.

    Args:
        pos: float [N, 3] positions (Angstrom).
        cutoff: edges with ``|edge_vec| < cutoff``.
        batch: long [N] sorted graph index per atom (None: one graph).
        cell: float [B, 3, 3] lattice vectors as rows (or [3, 3] for B = 1);
            zeros for molecules. Needed when any ``pbc`` is True.
        pbc: bool [B, 3] (or [3], broadcast) periodic directions. ``None``:
            no periodicity without ``cell``; with ``cell``, periodic along every
            non-zero lattice vector (a zero cell means molecule).
        max_neighbors: keep at most this many nearest sources per target.
        tie_mode: how ``max_neighbors`` treats sources tied with the
            k-th nearest (|d - d_k| <= ``tie_tol``):
            ``"strict"`` keeps exactly k: all sources with ``d < d_k - tie_tol``,
            then tied ones in the canonical order (source atom index, then the
            Cartesian edge vector rounded to 0.01 A, compared x, y, z
            lexicographically). The key never uses the image offsets, so the
            kept set of (source, Cartesian edge vector) is the same for any
            equivalent way of writing the cell (lattice reduction, a' = a + b,
            atoms wrapped differently) and does not depend on how images are
            enumerated. ``"include"`` keeps every source with
            ``d <= d_k + tie_tol`` (fairchem's non-strict mode uses
            ``tie_tol=0.01``), so a target may get more than k sources.
            EquiformerV2/fairchem's strict mode drops ties arbitrarily.
        tie_tol: distance tolerance (Angstrom) defining ties; the default 1e-4
            is well above float32 rounding of distances and well below any
            physical shell spacing.
        min_dist: two atoms (or an atom and a periodic image) closer than this
            raise ``ValueError``.

    Returns:
        :class:`Graph` (edge_index [2, E], edge_vec [E, 3], edge_len [E],
        cell_offsets long [E, 3]); see the module docstring for conventions.

    Raises:
        ValueError: NaN/inf positions (names the atom), overlapping atoms
            (names both indices and the graph), empty input or empty graphs,
            batch/cell/pbc shape mismatches, unsorted batch, pbc without cell,
            singular cell of a periodic graph, bad ``tie_mode``.
    """
    if tie_mode not in ("strict", "include"):
        raise ValueError(f"radius_graph: tie_mode must be 'strict' or 'include', got {tie_mode!r}")
    if max_neighbors is not None and (int(max_neighbors) != max_neighbors or max_neighbors < 1):
        raise ValueError(f"radius_graph: max_neighbors must be a positive int or None, got {max_neighbors!r}")
    batch, counts, ptr, B, cell, pbc = _check_inputs(pos, batch, cell, pbc, cutoff)
    device, dtype = pos.device, pos.dtype
    N = pos.shape[0]
    cutoff = float(cutoff)

    with torch.no_grad():
        posd = pos.detach()
        per = pbc.any(1)  # [B]
        any_per = bool(per.any())
        wrap = torch.zeros(N, 3, dtype=torch.long, device=device)
        nimg = [1] * B
        img_table = torch.zeros(B, 1, 3, dtype=torch.long, device=device)
        img_valid = torch.ones(B, 1, dtype=torch.bool, device=device)
        zero_pos = torch.zeros(B, dtype=torch.long, device=device)
        cell_d = None
        if any_per:
            # cells of non-periodic graphs are ignored (zeroed), whatever they hold
            cell_d = torch.where(per[:, None, None], cell.detach(), 0).to(dtype)  # [B, 3, 3]
            pg = per.nonzero().flatten()
            M = _completed_cells(cell, pbc, pg)  # [P, 3, 3] float64
            pp = pbc[pg]
            rownorm = cell.detach()[pg].double().norm(dim=-1)  # [P, 3]
            det = torch.linalg.det(M).abs()
            scale = torch.where(pp, rownorm, torch.ones_like(rownorm)).prod(-1)
            bad = (det <= 1e-8 * scale) | ((rownorm <= 1e-8) & pp).any(-1)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(
                    f"radius_graph: cell of periodic graph {int(pg[i])} is singular (|det| = {float(det[i]):.3g}, "
                    f"pbc = {pp[i].tolist()}); the periodic lattice vectors must be non-zero and linearly "
                    "independent (use pbc=False and a zero cell for molecules)"
                )
            # plane spacings h_k = V / |r_{k+1} x r_{k+2}|  -> images per axis
            cr = torch.linalg.cross(M[:, [1, 2, 0]], M[:, [2, 0, 1]])  # [P, 3, 3]
            h = det[:, None] / cr.norm(dim=-1)
            nk = torch.where(pp, torch.ceil(cutoff / h + 1e-6), torch.zeros_like(h)).long()  # [P, 3]
            # wrap atoms into the cell along periodic axes
            inv = torch.linalg.inv(M)  # [P, 3, 3]
            gmap = torch.full((B,), -1, dtype=torch.long, device=device)
            gmap[pg] = torch.arange(pg.numel(), device=device)
            atom_p = gmap[batch]
            am = atom_p >= 0
            frac = torch.einsum("ni,nij->nj", posd[am].double(), inv[atom_p[am]])
            w = torch.floor(frac).long() * pp[atom_p[am]]
            wrap[am] = w
            posw = posd - torch.einsum("ni,nij->nj", wrap.to(dtype), cell_d[batch])  # [N, 3]
            # candidate image offsets, pruned by bounding boxes
            nmax3 = nk.max(0).values
            axes = [torch.arange(-int(n), int(n) + 1, device=device) for n in nmax3.tolist()]
            grid = torch.cartesian_prod(*axes).reshape(-1, 3)  # [S, 3]
            lo = torch.full((B, 3), float("inf"), dtype=dtype, device=device).scatter_reduce(
                0, batch[:, None].expand(N, 3), posw, "amin")
            hi = torch.full((B, 3), float("-inf"), dtype=dtype, device=device).scatter_reduce(
                0, batch[:, None].expand(N, 3), posw, "amax")
            ext = (hi - lo)[pg].double()  # [P, 3]
            shift = torch.einsum("sk,pkl->psl", grid.double(), cell.detach()[pg].double())  # [P, S, 3]
            gap = (shift.abs() - ext[:, None]).clamp_min(0).norm(dim=-1)
            ok = (grid.abs()[None] <= nk[:, None]).all(-1) & (gap < cutoff * (1 + 1e-6) + 1e-6)
            S_g = ok.sum(1)
            smax = int(S_g.max())
            order = torch.sort((~ok).to(torch.uint8), dim=1, stable=True).indices[:, :smax]
            img_table = torch.zeros(B, smax, 3, dtype=torch.long, device=device)
            img_valid = torch.zeros(B, smax, dtype=torch.bool, device=device)
            img_valid[:, 0] = True
            img_table[pg] = grid[order]
            img_valid[pg] = torch.arange(smax, device=device)[None] < S_g[:, None]
            zero_pos[pg] = ((img_table[pg] == 0).all(-1) & img_valid[pg]).long().argmax(1)
            for i, g in enumerate(pg.tolist()):
                nimg[g] = int(S_g[i])
        else:
            posw = posd

        counts_l = counts.tolist()
        ptr_l = ptr.tolist()
        groups = _plan_groups(counts_l, nimg)
        # padding sentinels: padded targets sit at +far, dropped sources at -far
        far = 2.0 * float(posw.abs().max()) + 10.0 * cutoff + 1.0
        smax_all = img_table.shape[1]
        out_t, out_s, out_i = [], [], []
        for gl in groups:
            gids = torch.tensor(gl, dtype=torch.long, device=device)
            G = len(gl)
            nmax = max(counts_l[g] for g in gl)
            smax = max(nimg[g] for g in gl)
            ar = torch.arange(nmax, device=device)
            gptr = ptr[gids]  # [G]
            tvalid = ar[None] < counts[gids][:, None]  # [G, n]
            tidx = torch.where(tvalid, gptr[:, None] + ar[None], 0)  # [G, n]
            tpos = torch.where(tvalid[..., None], posw.index_select(0, tidx.view(-1)).view(G, nmax, 3), far)
            if smax > 1:
                offs = img_table[gids, :smax]  # [G, S, 3]
                ivalid = img_valid[gids, :smax]  # [G, S]
                shifts = torch.einsum("gsk,gkl->gsl", offs.to(dtype), cell_d[gids])  # [G, S, 3]
                spos = (tpos[:, None] + shifts[:, :, None]).reshape(G, smax * nmax, 3)  # [G, S*n, 3]
                svalid = (ivalid[:, :, None] & tvalid[:, None, :]).reshape(G, smax * nmax)
                # drop image atoms outside the targets' bounding box grown by the cutoff
                big = torch.finfo(dtype).max
                lo_g = torch.where(tvalid[..., None], tpos, big).amin(1, keepdim=True) - cutoff
                hi_g = torch.where(tvalid[..., None], tpos, -big).amax(1, keepdim=True) + cutoff
                svalid &= ((spos > lo_g) & (spos < hi_g)).all(-1)
                cmax = int(svalid.sum(1).max())
                order = torch.sort((~svalid).to(torch.uint8), dim=1, stable=True).indices  # [G, S*n]
                cidx = order[:, :cmax]  # [G, C] candidate -> (image slot, atom)
                spos = torch.gather(spos, 1, cidx[..., None].expand(G, cmax, 3))
                spos = torch.where(torch.gather(svalid, 1, cidx)[..., None], spos, -far)  # [G, C, 3]
                # column of each target's own (home-image) copy, to mask self pairs
                inv = torch.empty_like(order)
                inv.scatter_(1, order, torch.arange(order.shape[1], device=device).expand_as(order))
                self_col = torch.gather(inv, 1, zero_pos[gids][:, None] * nmax + ar[None])  # [G, n]
                self_col = self_col.clamp_max(cmax - 1)  # padded targets: any column (they are far away)
            else:
                spos = torch.where(tvalid[..., None], tpos, -far)
                cidx = ar[None].expand(G, nmax)
                self_col = cidx
            C = spos.shape[1]
            # squared distances as one batched matmul, in float64 on coordinates centred per graph:
            # |a - b|^2 = [a, 1, |a|^2] . [-2b, |b|^2, 1]  (abs. error ~1e-12 A^2 for real atoms)
            centre = (torch.where(tvalid[..., None], tpos, 0).sum(1, keepdim=True)
                      / counts[gids][:, None, None]).double()  # [G, 1, 3]
            tq = tpos.double() - centre  # [G, n, 3]
            sq = spos.double() - centre  # [G, C, 3]
            tn = tq[..., 0:1].square() + tq[..., 1:2].square() + tq[..., 2:3].square()  # [G, n, 1]
            sn = sq[..., 0:1].square() + sq[..., 1:2].square() + sq[..., 2:3].square()  # [G, C, 1]
            A = torch.cat([tq, torch.ones_like(tn), tn], -1)  # [G, n, 5]
            Bt = torch.cat([-2.0 * sq, sn, torch.ones_like(sn)], -1)
            Bt = Bt.transpose(1, 2).contiguous()  # [G, 5, C]
            s_img = cidx // nmax  # [G, C] image slot
            src_table = (gptr[:, None] + cidx - s_img * nmax).reshape(-1)  # [G*C] global source atom
            img_id = (gids[:, None] * smax_all + s_img).reshape(-1)  # [G*C] row of img_table.view(-1, 3)
            tchunk = max(1, min(nmax, _BLOCK_BUDGET // max(1, G * C)))
            for t0 in range(0, nmax, tchunk):
                t1 = min(nmax, t0 + tchunk)
                T = t1 - t0
                d2 = torch.bmm(A[:, t0:t1], Bt)  # [G, T, C] squared distances
                d2.scatter_(2, self_col[:, t0:t1, None], float("inf"))  # no self pairs
                flat = (d2.view(-1) < cutoff * cutoff).nonzero().flatten()  # [E0] candidate edges
                de = d2.view(-1).index_select(0, flat).clamp_min(0).sqrt()  # [E0]
                row = flat // C  # [E0] g*T + t
                gc = flat - row * C + (row // T) * C  # [E0] g*C + c
                if de.numel() and float(de.min()) < min_dist:
                    e = int((de < min_dist).nonzero()[0, 0])
                    gl_e, t_e = int(row[e]) // T, int(row[e]) % T + t0
                    i = ptr_l[gl[gl_e]] + t_e
                    j = int(src_table[gc[e]])
                    img = img_table.view(-1, 3)[img_id[gc[e]]] - wrap[j] + wrap[i]
                    where = "" if not bool(img.any()) else f" (periodic image {img.tolist()} of atom {j})"
                    raise ValueError(
                        f"radius_graph: atoms {i} and {j} of graph {gl[gl_e]} are {float(de[e]):.3g} A "
                        f"apart{where}, closer than min_dist={min_dist}; duplicated atoms or a broken structure"
                    )
                tgt_table = (gptr[:, None] + t0 + torch.arange(T, device=device)[None]).reshape(-1)  # [G*T]
                srcs = src_table.index_select(0, gc)  # [E0]
                if max_neighbors is not None:
                    tp_flat = tpos[:, t0:t1].reshape(-1, 3)

                    def rel(sel, gc=gc, row=row, tp_flat=tp_flat, spos=spos):
                        return spos.view(-1, 3)[gc[sel]] - tp_flat[row[sel]]  # [A, 3]

                    keep = _select_sparse(row, de, G * T, rel, srcs, max_neighbors, tie_mode, tie_tol)
                    if keep is not None:
                        keep = keep.nonzero().flatten()
                        row, gc, srcs = row.index_select(0, keep), gc.index_select(0, keep), srcs.index_select(0, keep)
                out_t.append(tgt_table.index_select(0, row))
                out_s.append(srcs)
                out_i.append(img_id.index_select(0, gc))

        tgt = torch.cat(out_t) if len(out_t) > 1 else out_t[0]
        src = torch.cat(out_s) if len(out_s) > 1 else out_s[0]
        iid = torch.cat(out_i) if len(out_i) > 1 else out_i[0]
        if len(out_t) > 1:
            # each (group, chunk) is target-sorted within a graph; sort globally (stable)
            perm = torch.sort(tgt, stable=True).indices
            tgt, src, iid = tgt[perm], src[perm], iid[perm]
        if any_per:
            off = (img_table.view(-1, 3).index_select(0, iid) - wrap.index_select(0, src)
                   + wrap.index_select(0, tgt))  # [E, 3]
        else:
            off = torch.zeros(tgt.numel(), 3, dtype=torch.long, device=device)

    # differentiable edge vectors: pos[j] + off @ cell - pos[i], evaluated as
    # pos_w[j] + img @ cell - pos_w[i] with pos_w = pos - wrap @ cell (same value, fewer gathers)
    if any_per:
        cell_t = torch.where(per[:, None, None], cell, 0).to(dtype)  # [B, 3, 3]
        pos_w = pos - torch.einsum("nk,nkl->nl", wrap.to(dtype), cell_t[batch])  # [N, 3]
        shift_tab = torch.einsum("bsk,bkl->bsl", img_table.to(dtype), cell_t).reshape(-1, 3)  # [B*S, 3]
        edge_vec = pos_w.index_select(0, src) - pos_w.index_select(0, tgt) + shift_tab.index_select(0, iid)
    else:
        edge_vec = pos.index_select(0, src) - pos.index_select(0, tgt)  # [E, 3]
    edge_len = torch.linalg.vector_norm(edge_vec, dim=-1)  # [E]
    return Graph(torch.stack([src, tgt]), edge_vec, edge_len, off)


# --------------------------------------------------------------------------
# edge frames, cells, strain
# --------------------------------------------------------------------------
_SWITCH = -0.9  # use the second chart when u_y < _SWITCH (within ~26 deg of -y)


def edge_rotation(edge_vec: Tensor) -> Tensor:
    """Rotation matrices ``R`` [E, 3, 3] with ``R @ (edge_vec / |edge_vec|) = +y``.

    e3nn's pole is +y, so ``R`` maps each edge into its frame (row 1 of ``R``
    is the unit edge direction). Deterministic (no random roll), differentiable,
    and finite in value and gradient for every non-zero edge, including edges
    exactly along +y or -y:

    * for ``u_y >= -0.9``: the minimal rotation taking u to +y,
      ``R = c I + [v]_x + v v^T / (1 + c)`` with ``c = u_y``, ``v = u x y``
      (``1 + c >= 0.1``, so no blow-up; R = I for u = +y);
    * for ``u_y < -0.9`` (near -y): ``diag(-1, -1, 1) @ R_-(u)`` with ``R_-`` the
      minimal rotation taking u to -y (a rotation by pi about z then maps -y to
      +y).

    The two charts differ by a roll about the edge axis, so ``R`` jumps on the
    circle ``u_y = -0.9``; quantities that are invariant to that roll
    (SO(2)-equivariant edge convolutions) are continuous. The separable S2
    activation on an equiangular grid is roll-equivariant only up to aliasing,
    so a model's output jumps slightly when a bond crosses the circle: at
    random init (float64, 5 atoms) max|dF| = 3e-12 on the 10x9 grid and round-off
    (<1e-14) from 12x11 up, 18x18 included; with 30x larger activation
    amplitudes 2e-8 (10x9), 9e-9 (14x13, L=6), 3e-11 (18x18, L=6)
    (``PYTHONPATH=. python tests/test_message.py``). Only the chart sign
    is chosen with ``torch.where`` and ``1 + c >= 0.1`` in the chosen chart, so
    values and gradients are finite everywhere (no NaN at the poles).
    Zero-length edges are not meaningful (radius_graph never returns them).
    """
    if edge_vec.dim() != 2 or edge_vec.shape[-1] != 3:
        raise ValueError(f"edge_rotation: edge_vec must be [E, 3], got {tuple(edge_vec.shape)}")
    n = torch.linalg.vector_norm(edge_vec, dim=-1, keepdim=True)  # [E, 1]
    u = edge_vec / n.clamp_min(torch.finfo(edge_vec.dtype).tiny ** 0.5)  # [E, 3]
    # chart sign s = +1 (minimal rotation to +y) or -1 (minimal rotation to -y, then diag(-1,-1,1));
    # s is piecewise constant, so no gradient flows through it
    sg = torch.where(u[:, 1] >= _SWITCH, 1.0, -1.0).to(u.dtype)  # [E]
    c = sg * u[:, 1]  # [E] cos of the angle to the chart's pole, >= 0.9 ... >= -0.9 -> 1 + c >= 0.1
    vx, vz = -sg * u[:, 2], sg * u[:, 0]  # v = u x (s y) = (vx, 0, vz)
    inv = 1.0 / (1.0 + c).clamp_min(1.0 + _SWITCH)  # [E]
    vxz = vx * vz * inv
    R = torch.stack(
        [
            sg * (c + vx * vx * inv), -sg * vz, sg * vxz,
            sg * vz, sg * c, -sg * vx,
            vxz, vx, c + vz * vz * inv,
        ],
        -1,
    ).view(-1, 3, 3)  # [E, 3, 3]: R = diag(s, s, 1) (c I + [v]_x + v v^T / (1 + c))
    return R


def cell_volume(cell: Tensor) -> Tensor:
    """|det(cell)| per graph: [B, 3, 3] -> [B] (or [3, 3] -> scalar).

    Includes vacuum along non-periodic directions; zero for molecules."""
    return torch.linalg.det(cell).abs()


def apply_strain(pos: Tensor, cell: Tensor, batch: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Deform positions and cells by a zero strain that requires grad.

    ``displacement`` [B, 3, 3] is a leaf of zeros with ``requires_grad=True``;
    ``eps = (displacement + displacement^T) / 2`` is applied as
    ``pos' = pos (I + eps[batch])`` and ``cell' = cell (I + eps)`` (row
    vectors), so ``pos' == pos`` and ``cell' == cell`` in value. Build the graph
    and the energy from ``pos'`` and ``cell'``; then
    ``dE/d displacement`` (symmetric) is the virial and
    ``stress = (1/V) dE/d eps`` (ASE sign convention, eV/A^3), see
    :func:`stress_from_energy`. Forces are ``-dE/dpos`` as usual (take the
    gradient w.r.t. the original ``pos``, which must require grad).

    Returns:
        (pos' [N, 3], cell' [B, 3, 3], displacement [B, 3, 3]).
    """
    if cell.dim() == 2:
        cell = cell.unsqueeze(0)
    B = cell.shape[0]
    if batch is None:
        batch = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
    disp = torch.zeros(B, 3, 3, dtype=pos.dtype, device=pos.device, requires_grad=True)
    eps = 0.5 * (disp + disp.transpose(1, 2))  # [B, 3, 3]
    pos_s = pos + torch.einsum("ni,nij->nj", pos, eps[batch])  # [N, 3]
    cell_s = cell + torch.bmm(cell, eps)  # [B, 3, 3]
    return pos_s, cell_s, disp


def stress_from_energy(
    energy: Tensor, displacement: Tensor, cell: Tensor, *, create_graph: bool = False
) -> Tensor:
    """Stress [B, 3, 3] = (1/V) dE/d eps from the ``displacement`` of
    :func:`apply_strain` (E summed over graphs; V = |det cell|, must be > 0)."""
    (grad,) = torch.autograd.grad(energy.sum(), displacement, create_graph=create_graph)
    vol = cell_volume(cell if cell.dim() == 3 else cell.unsqueeze(0))
    if bool((vol <= 0).any()):
        raise ValueError("stress_from_energy: zero cell volume (molecule?); stress needs a periodic cell")
    return grad / vol[:, None, None]

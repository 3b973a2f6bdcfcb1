r"""Synthetic geometric graphs that separate models by what they can express.

Each task is a pair of small graphs (class 0 and class 1) with edges given
explicitly (no cutoff graph), re-created from the descriptions in Joshi et al.
2023 ("On the Expressive Power of Geometric Graph Neural Networks") and
Pozdnyakov et al. 2020 ("Incompleteness of atomic structure representations").

* ``rotsym`` (``fold=k``): a k-spoke star and the same star turned about its
  axis by :math:`0 < q < 2\pi/k`. The two graphs are congruent, so only a
  model whose *readout* is not invariant (pooled :math:`l > 0` features) can
  tell them apart, and an exactly equivariant model can do so only if its
  features reach degree :math:`L \ge k`: every equivariant function of a
  :math:`C_k`-symmetric input lies in the :math:`C_k`-fixed subspace, which for
  :math:`l < k` is fixed by *all* rotations about the axis.
* ``kchain`` (``k``): a straight chain of ``k`` nodes with one extra node at
  each end; the first end node sits on one side of the chain axis in class 0
  and on the other side in class 1. Not congruent (checked), but locally
  identical: information has to travel about :math:`\lfloor k/2\rfloor + 1`
  hops, so the number of layers is the variable. Invariant readout.
* ``counterexample`` (``body=b``): a centre and its neighbours (a star) in
  two environments whose ``b``-body descriptors are identical multisets, so
  that only :math:`(b+1)`-body information separates them. One layer,
  invariant readout.

  - ``body=2``: two neighbours at the same distances, different angle.
  - ``body=3``: four neighbours on a circle at the 8-gon positions
    {0, 1, 2, 5} vs {0, 1, 3, 4}: a homometric pair, every pairwise angle
    multiset agrees, triples differ.
  - ``body=4, chiral=True``: a chiral environment (three neighbours at
    different distances, not coplanar with the centre) and its mirror image.
    Every distance and angle multiset of every order agrees; only a signed
    four-body quantity such as :math:`(r_1 \times r_2)\cdot r_3` separates them,
    which SO(3)- (not O(3)-) invariant models can represent.
  - ``body=4, chiral=False`` is not shipped (no non-mirror 4-body-degenerate
    pair found among n-gon subsets or polyhedron vertices): a clear error.

Positions are float64, in Angstrom-like units of order 1. :func:`descriptors`
computes the b-body multisets so tests can check each pair by construction.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from torch_geometric.data import Data

__all__ = ["Task", "TASKS", "make_task", "descriptors", "congruent"]

TASKS = ("rotsym", "kchain", "counterexample")


@dataclass(kw_only=True)
class Task:
    """A classification task on a few small geometric graphs.

    graphs: PyG ``Data`` with ``pos`` float64 ``[n, 3]``, ``atomic_numbers``
    long ``[n]``, ``edge_index`` long ``[2, E]`` (both directions), ``y`` long
    ``[1]`` class label. ``readout``: ``"invariant"`` (a model may only use
    rotation-invariant features at readout) or ``"equivariant"`` (pooled
    ``l > 0`` features may feed the classifier, as in the rotational-symmetry
    experiment).
    """

    name: str
    graphs: list[Data]
    num_classes: int
    readout: str
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.readout not in ("invariant", "equivariant"):
            raise ValueError(f"Task.readout must be 'invariant' or 'equivariant', got {self.readout!r}")

    @property
    def max_edge_length(self) -> float:
        return max(float((g.pos[g.edge_index[0]] - g.pos[g.edge_index[1]]).norm(dim=-1).max()) for g in self.graphs)

    @property
    def mean_degree(self) -> float:
        return float(np.mean([g.edge_index.shape[1] / g.num_nodes for g in self.graphs]))

    def __repr__(self) -> str:
        return f"Task({self.name!r}, {self.params}, graphs={len(self.graphs)}, readout={self.readout!r})"


def _graph(pos, edges, label: int) -> Data:
    pos = torch.as_tensor(np.asarray(pos, dtype=np.float64))  # [n, 3]
    pos = pos - pos.mean(dim=0, keepdim=True)  # centred
    e = torch.as_tensor(np.asarray(edges, dtype=np.int64).T)  # [2, E/2]
    edge_index = torch.cat([e, e.flip(0)], dim=1)  # [2, E] both directions
    n = pos.shape[0]
    return Data(
        pos=pos,
        atomic_numbers=torch.ones(n, dtype=torch.long),
        edge_index=edge_index,
        y=torch.tensor([label]),
        natoms=torch.tensor([n]),
    )


def _star(neighbours) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Centre at the origin (node 0) joined to each neighbour."""
    nb = np.asarray(neighbours, dtype=np.float64)  # [m, 3]
    pos = np.concatenate([np.zeros((1, 3)), nb])  # [m + 1, 3]
    return pos, [(0, j + 1) for j in range(len(nb))]


# ---------------------------------------------------------------- rotsym
def _rotsym(fold: int = 3, angle: float | None = None) -> Task:
    if not isinstance(fold, (int, np.integer)) or fold < 2:
        raise ValueError(f"rotsym: fold must be an integer >= 2 (a k-fold star), got {fold!r}")
    period = 2 * math.pi / fold
    angle = period / 2 if angle is None else float(angle)
    if not 0 < angle < period:
        raise ValueError(f"rotsym: angle must be strictly between 0 and 2*pi/fold = {period:.6g}, got {angle}")

    def spokes(offset: float) -> list[list[float]]:
        return [[math.cos(offset + c * period), math.sin(offset + c * period), 0.0] for c in range(fold)]

    graphs = [_graph(*_star(spokes(0.0)), label=0), _graph(*_star(spokes(angle)), label=1)]
    return Task(name="rotsym", graphs=graphs, num_classes=2, readout="equivariant",
                params=dict(fold=fold, angle=angle))


# ---------------------------------------------------------------- kchain
def _kchain(k: int = 4, bond: float = 1.5) -> Task:
    if not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"kchain: k must be an integer >= 2 (chain nodes between the two end nodes), got {k!r}")
    # chain along y; end nodes bonded at 'bond' length, tilted off the axis
    # (a 3-4-5 triangle: offsets (+-0.8, -0.6) * bond)
    chain = [[0.0, bond * i, 0.0] for i in range(k)]
    last = [0.8 * bond, bond * (k - 1) + 0.6 * bond, 0.0]
    edges = [(i, i + 1) for i in range(k + 1)]
    graphs = []
    for label, side in ((0, 1.0), (1, -1.0)):
        first = [side * 0.8 * bond, -0.6 * bond, 0.0]
        graphs.append(_graph([first] + chain + [last], edges, label))
    n = k + 2
    reverse = list(range(n))[::-1]
    if congruent(graphs[0].pos, graphs[1].pos, [list(range(n)), reverse], proper_only=True):
        raise AssertionError("kchain: the two chains are congruent; the task would be impossible")
    return Task(name="kchain", graphs=graphs, num_classes=2, readout="invariant", params=dict(k=k))


# ---------------------------------------------------------------- counterexamples
def _circle(positions: list[int], n: int) -> list[list[float]]:
    return [[math.cos(2 * math.pi * p / n), math.sin(2 * math.pi * p / n), 0.0] for p in positions]


def _chiral_environment() -> list[list[float]]:
    # three neighbours at different distances, not coplanar with the centre
    return [[1.0, 0.0, 0.0], [0.2, 1.3, 0.0], [0.3, 0.4, 1.6]]


def _counterexample(body: int = 2, chiral: bool | None = None) -> Task:
    if body not in (2, 3, 4):
        raise ValueError(f"counterexample: body must be 2, 3 or 4, got {body!r}")
    if chiral is not None and body != 4:
        raise ValueError("counterexample: chiral= applies to body=4 only")
    if body == 2:
        a = [[1.0, 0.0, 0.0], [0.5, 0.0, math.sqrt(3) / 2]]  # 60 degrees apart
        b = [[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]  # 180 degrees apart
    elif body == 3:
        a, b = _circle([0, 1, 2, 5], 8), _circle([0, 1, 3, 4], 8)
    elif chiral or chiral is None:
        chiral = True
        a = _chiral_environment()
        b = [[-x, y, z] for x, y, z in a]  # mirror image
    else:
        raise ValueError(
            "counterexample body=4 chiral=False is not available: we ship no non-mirror pair with identical "
            "4-body multisets (none exists among subsets of regular n-gons, n <= 28, or of the icosahedron, "
            "cuboctahedron and dodecahedron vertices); use chiral=True or body=3"
        )
    graphs = [_graph(*_star(a), label=0), _graph(*_star(b), label=1)]
    m = len(a)
    perms = [[0] + [1 + i for i in p] for p in itertools.permutations(range(m))]
    if congruent(graphs[0].pos, graphs[1].pos, perms, proper_only=True):
        raise AssertionError(f"counterexample body={body}: the two environments are congruent")
    for order in range(2, body + 1):
        if descriptors(graphs[0].pos, order) != descriptors(graphs[1].pos, order):
            raise AssertionError(f"counterexample body={body}: {order}-body descriptors differ")
    params = dict(body=body) if body != 4 else dict(body=body, chiral=bool(chiral))
    return Task(name="counterexample", graphs=graphs, num_classes=2, readout="invariant", params=params)


_MAKERS = {"rotsym": _rotsym, "kchain": _kchain, "counterexample": _counterexample}


def make_task(name: str, **params) -> Task:
    """Build a task by name: ``rotsym`` (``fold``, ``angle``), ``kchain`` (``k``),
    ``counterexample`` (``body``, ``chiral``)."""
    if name not in _MAKERS:
        raise ValueError(f"unknown expressivity task {name!r}; choose one of {TASKS}")
    try:
        return _MAKERS[name](**params)
    except TypeError as err:  # unknown keyword
        raise ValueError(f"make_task({name!r}): {err}") from None


# ---------------------------------------------------------------- checks
def congruent(a: torch.Tensor, b: torch.Tensor, correspondences, *, proper_only: bool = True,
              tol: float = 1e-6) -> bool:
    """Whether some rotation (and translation) maps ``a [n, 3]`` onto ``b`` for
    one of the node ``correspondences`` (lists ``perm`` with ``a[i] -> b[perm[i]]``).

    Kabsch alignment per correspondence; ``proper_only`` excludes reflections.
    """
    A = np.asarray(a, dtype=np.float64)
    A = A - A.mean(0)
    for perm in correspondences:
        B = np.asarray(b, dtype=np.float64)[list(perm)]
        B = B - B.mean(0)
        U, _, Vt = np.linalg.svd(A.T @ B)
        d = np.sign(np.linalg.det(U @ Vt)) if proper_only else 1.0
        R = U @ np.diag([1.0, 1.0, d]) @ Vt  # A @ R ~ B
        if np.abs(A @ R - B).max() < tol:
            return True
    return False


def descriptors(pos: torch.Tensor, order: int, *, centre: int = 0, decimals: int = 8) -> Counter:
    """Multiset of the ``order``-body descriptors of the environment of ``centre``.

    order 2: neighbour distances; 3: (sorted distance pair, angle) per pair;
    4: for each neighbour triple, its three distances and three angles in the
    canonical (minimal) ordering, unsigned (mirror images agree).
    """
    p = np.asarray(pos, dtype=np.float64)
    r = np.delete(p - p[centre], centre, axis=0)  # [m, 3]
    d = np.linalg.norm(r, axis=1)  # [m]
    u = r / d[:, None]

    def angle(i, j):
        return float(np.arccos(np.clip(u[i] @ u[j], -1, 1)))

    out: Counter = Counter()
    for combo in itertools.combinations(range(len(r)), order - 1):
        best = None
        for perm in itertools.permutations(combo):
            key = tuple(d[i] for i in perm) + tuple(angle(i, j) for i, j in itertools.combinations(perm, 2))
            key = tuple(round(v, decimals) for v in key)
            best = key if best is None or key < best else best
        out[best] += 1
    return out

"""Starting geometries of small organic molecules for the GFN2-xTB MD set (:mod:`est.data.xtb`).

Ethanol comes from ``ase.build.molecule("CH3CH2OH")``; malonaldehyde (the
cis-enol with its O-H...O hydrogen bond), aspirin and paracetamol are written
here as Z-matrices (bond length in A, bond angle and dihedral in degrees, with
textbook values: aromatic C-C 1.39, C-H 1.08-1.09, C=O 1.21-1.23, ring angles
120) and turned into Cartesian coordinates by :func:`zmatrix_to_positions`.
They are approximate on purpose: the generator relaxes every molecule with
GFN2-xTB before the MD, and a test checks that the relaxed bond graph is still
the intended molecule (:data:`BONDS`, bond counts per element pair).

Z-matrix rows are ``(symbol, i, r, j, theta, k, phi)`` with 0-based indices of
earlier atoms; atom ``d`` is placed with ``|d - i| = r``, angle
``(j, i, d) = theta`` and dihedral ``(k, j, i, d) = phi`` (the first three
rows use the leading fields only). With ``b = x_i - x_j`` normalised, ``n``
the unit normal of the plane ``(k, j, i)`` and ``m = n x b``::

    x_d = x_i + r (-cos(theta) b + sin(theta) cos(phi) m + sin(theta) sin(phi) n)
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Sequence, Tuple

import numpy as np

__all__ = ["MOLECULES", "BONDS", "molecule", "zmatrix_to_positions", "bond_counts", "bond_graph"]

Row = Tuple  # (symbol,) | (symbol, i, r) | (symbol, i, r, j, theta) | (symbol, i, r, j, theta, k, phi)


def _ring() -> list:
    """A regular benzene ring C0..C5 (C-C 1.39 A) in one plane; C5 closes onto C0."""
    return [("C",), ("C", 0, 1.39), ("C", 1, 1.39, 0, 120.0), ("C", 2, 1.39, 1, 120.0, 0, 0.0),
            ("C", 3, 1.39, 2, 120.0, 1, 0.0), ("C", 4, 1.39, 3, 120.0, 2, 0.0)]


def _methyl(c: int, j: int, k: int) -> list:
    """Three H on carbon ``c`` (bonded to ``j``), staggered about the dihedral reference ``k``."""
    return [("H", c, 1.09, j, 109.5, k, phi) for phi in (60.0, 180.0, 300.0)]


def _ring_h(c: int, j: int, k: int) -> tuple:
    """An aromatic H on ring carbon ``c`` (neighbour ``j``, next ``k``), pointing radially out."""
    return ("H", c, 1.08, j, 120.0, k, 180.0)


# cis-enol malonaldehyde O=CH-CH=CH-OH, planar, the OH pointing at the carbonyl O
_MALONALDEHYDE = [
    ("C",),                                  # 0 C1 (aldehyde carbon)
    ("C", 0, 1.44),                          # 1 C2
    ("C", 1, 1.36, 0, 120.0),                # 2 C3 (enol carbon)
    ("O", 0, 1.23, 1, 124.0, 2, 0.0),        # 3 O1 carbonyl, cis to C3
    ("O", 2, 1.33, 1, 124.0, 0, 0.0),        # 4 O2 hydroxyl, facing O1
    ("H", 4, 0.98, 2, 106.0, 1, 0.0),        # 5 H on O2, towards O1
    ("H", 0, 1.10, 1, 116.0, 2, 180.0),      # 6 H on C1
    ("H", 1, 1.08, 0, 120.0, 3, 180.0),      # 7 H on C2
    ("H", 2, 1.08, 1, 120.0, 0, 180.0),      # 8 H on C3
]

# aspirin: ring C0..C5, carboxylic acid on C0 (syn O=C-O-H), acetoxy on C1 (acetyl out of the ring plane)
_ASPIRIN = _ring() + [
    ("C", 0, 1.48, 1, 120.0, 2, 180.0),      # 6 carboxyl C
    ("O", 6, 1.22, 0, 123.0, 1, 0.0),        # 7 carbonyl O, towards the acetoxy side
    ("O", 6, 1.34, 0, 113.0, 1, 180.0),      # 8 hydroxyl O
    ("H", 8, 0.97, 6, 106.0, 0, 180.0),      # 9 acid H (syn to the carbonyl O)
    ("O", 1, 1.39, 2, 120.0, 3, 180.0),      # 10 ester O on C1
    ("C", 10, 1.36, 1, 118.0, 0, 90.0),      # 11 acetyl C
    ("O", 11, 1.20, 10, 123.0, 1, 0.0),      # 12 acetyl carbonyl O
    ("C", 11, 1.50, 10, 110.0, 1, 180.0),    # 13 methyl C
    *_methyl(13, 11, 10),                    # 14-16
    _ring_h(2, 1, 0), _ring_h(3, 2, 1), _ring_h(4, 3, 2), _ring_h(5, 4, 3),  # 17-20
]

# paracetamol (4-acetamidophenol): ring C0..C5, OH on C0, trans amide N-H / C=O on C3
_PARACETAMOL = _ring() + [
    ("O", 0, 1.36, 1, 120.0, 2, 180.0),      # 6 phenol O
    ("H", 6, 0.97, 0, 109.0, 1, 0.0),        # 7 phenol H
    ("N", 3, 1.41, 2, 120.0, 1, 180.0),      # 8 amide N
    ("H", 8, 1.01, 3, 117.0, 2, 0.0),        # 9 N-H
    ("C", 8, 1.36, 3, 128.0, 2, 180.0),      # 10 carbonyl C
    ("O", 10, 1.23, 8, 123.0, 3, 0.0),       # 11 carbonyl O (trans to N-H)
    ("C", 10, 1.51, 8, 115.0, 3, 180.0),     # 12 methyl C
    *_methyl(12, 10, 8),                     # 13-15
    _ring_h(1, 2, 3), _ring_h(2, 3, 4), _ring_h(4, 3, 2), _ring_h(5, 4, 3),  # 16-19
]

_ZMATRICES: Dict[str, list] = {"malonaldehyde": _MALONALDEHYDE, "aspirin": _ASPIRIN, "paracetamol": _PARACETAMOL}

#: known molecule names (ethanol from ASE, the others from the Z-matrices above)
MOLECULES: Tuple[str, ...] = ("ethanol", "malonaldehyde", "aspirin", "paracetamol")

#: covalent bonds per element pair of each molecule (what its relaxed geometry must show)
BONDS: Dict[str, Dict[str, int]] = {
    "ethanol": {"C-C": 1, "C-O": 1, "C-H": 5, "H-O": 1},
    "malonaldehyde": {"C-C": 2, "C-O": 2, "C-H": 3, "H-O": 1},
    "aspirin": {"C-C": 8, "C-O": 5, "C-H": 7, "H-O": 1},
    "paracetamol": {"C-C": 7, "C-O": 2, "C-N": 2, "C-H": 7, "H-O": 1, "H-N": 1},
}


def zmatrix_to_positions(rows: Sequence[Row]) -> np.ndarray:
    """Cartesian positions ``[n, 3]`` (A) of Z-matrix ``rows`` (see module docstring)."""
    pos = np.zeros((len(rows), 3))
    for d, row in enumerate(rows):
        if d == 0:
            continue
        i, r = row[1], float(row[2])
        if d == 1:
            pos[d] = pos[i] + [r, 0.0, 0.0]
            continue
        j, theta = row[3], np.radians(row[4])
        if d == 2:  # in the xy plane
            b = (pos[i] - pos[j]) / np.linalg.norm(pos[i] - pos[j])
            m = np.cross([0.0, 0.0, 1.0], b)
            pos[d] = pos[i] + r * (-np.cos(theta) * b + np.sin(theta) * m)
            continue
        k, phi = row[5], np.radians(row[6])
        b = pos[i] - pos[j]
        b /= np.linalg.norm(b)
        n = np.cross(pos[j] - pos[k], b)
        n /= np.linalg.norm(n)
        m = np.cross(n, b)
        pos[d] = pos[i] + r * (-np.cos(theta) * b + np.sin(theta) * (np.cos(phi) * m + np.sin(phi) * n))
    return pos


def molecule(name: str):
    """Unrelaxed ``ase.Atoms`` of molecule ``name`` (one of :data:`MOLECULES`), centred at the origin."""
    from ase import Atoms
    from ase.build import molecule as ase_molecule

    if name not in MOLECULES:
        raise ValueError(f"unknown molecule {name!r}; known molecules: {', '.join(MOLECULES)}")
    if name == "ethanol":
        atoms = ase_molecule("CH3CH2OH")
    else:
        rows = _ZMATRICES[name]
        atoms = Atoms([row[0] for row in rows], positions=zmatrix_to_positions(rows))
    atoms.positions -= atoms.get_center_of_mass()
    return atoms


def bond_graph(numbers: np.ndarray, positions: np.ndarray, *, scale: float = 1.2) -> np.ndarray:
    """Bonded pairs ``[n_bonds, 2]`` (i < j): distance < ``scale`` x the sum of covalent radii."""
    from ase.data import covalent_radii

    radii = covalent_radii[np.asarray(numbers)]                              # [n]
    dist = np.linalg.norm(positions[:, None] - positions[None], axis=-1)    # [n, n]
    i, j = np.nonzero(np.triu(dist < scale * (radii[:, None] + radii[None]), k=1))
    return np.stack([i, j], axis=1)


def bond_counts(atoms, *, scale: float = 1.2) -> Dict[str, int]:
    """Covalent bonds of ``atoms`` per element pair (``{"C-H": 5, ...}``, symbols sorted)."""
    sym = atoms.get_chemical_symbols()
    pairs = bond_graph(atoms.numbers, atoms.positions, scale=scale)
    return dict(Counter("-".join(sorted((sym[i], sym[j]))) for i, j in pairs))

"""Readers (and writers, for tests and export) of the real QM9 file formats.

Three sources carry the same 133,885 B3LYP/6-31G(2df,p) molecules
(Ramakrishnan et al., Sci. Data 1, 140022, 2014):

* ``qm9pack`` CSV files (``qm9_part{1,2,3}.csv``): one row per molecule with
  ``Index``, ``Elements`` (``"['C','H',...]"``), ``XYZ_Ang``
  (``"[[x,y,z],...]"``, numbers like ``1.``) and the properties in QM9's own
  units (Hartree, Debye, bohr^3, bohr^2, GHz, cal/mol K). The 3,054
  uncharacterised molecules are already left out (130,831 rows).
* PyG's raw folder: ``gdb9.sdf`` (V2000 molfiles, coordinates with 4
  decimals; parsed here, no RDKit), ``gdb9.sdf.csv`` (``mol_id`` and 19
  numbers: A, B, C, mu, alpha, homo, lumo, gap, r2, zpve, u0, u298, h298,
  g298, cv, then the four atomisation energies in kcal/mol) and
  ``uncharacterized.txt``.
* The original release ``dsgdb9nsd.xyz.tar.bz2`` (or its extracted folder):
  per molecule an atom count, a ``gdb N`` line with 15 properties, atoms with
  Mulliken charges, frequencies, SMILES, InChI. Numbers may use
  Mathematica's exponent notation (``1.2*^-5``).

Every reader yields :class:`Record` objects; :func:`to_pyg_targets` turns
QM9's native units into PyG's 19 targets.
"""
from __future__ import annotations

import csv
import functools
import glob
import io
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np

__all__ = [
    "Record", "HAR2EV", "KCALMOL2EV", "HAR2KCALMOL", "B3LYP_ATOM_ENERGIES", "SYMBOL_TO_Z",
    "TARGET_NAMES", "TARGET_UNITS", "NATIVE_KEYS",
    "to_pyg_targets", "read_qm9pack_csv", "read_pyg_raw", "parse_xyz", "read_xyz_tar",
    "read_xyz_folder", "read_uncharacterized", "shipped_uncharacterized",
    "write_pyg_raw", "format_xyz", "write_xyz_tar", "write_xyz_folder", "qm9pack_data_dir",
    "QM9_RAW_SIZE", "QM9PACK_PARTS", "QM9_RELEASE_PART", "qm9_gaps",
]

HAR2EV = 27.211386246  # CODATA 2018, as PyG
KCALMOL2EV = 0.04336414  # as PyG
HAR2KCALMOL = 627.509474  # Hartree in kcal/mol (CODATA)

SYMBOL_TO_Z = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9}
Z_TO_SYMBOL = {v: k for k, v in SYMBOL_TO_Z.items()}

#: QM9's free-atom B3LYP/6-31G(2df,p) energies (the release's atomref table),
#: Hartree, columns U0, U(298.15 K), H(298.15 K), G(298.15 K)
B3LYP_ATOM_ENERGIES: Dict[int, Tuple[float, float, float, float]] = {
    1: (-0.500273, -0.498857, -0.497912, -0.510927),
    6: (-37.846772, -37.845355, -37.844411, -37.861317),
    7: (-54.583861, -54.582445, -54.581501, -54.598897),
    8: (-75.064579, -75.063162, -75.062219, -75.079532),
    9: (-99.718730, -99.717314, -99.716370, -99.733544),
}

#: PyG's 19 targets, in order
TARGET_NAMES = (
    "mu", "alpha", "homo", "lumo", "gap", "r2", "zpve", "U0", "U", "H", "G", "cv",
    "U0_atom", "U_atom", "H_atom", "G_atom", "A", "B", "C",
)
TARGET_UNITS = (
    "D", "a0^3", "eV", "eV", "eV", "a0^2", "eV", "eV", "eV", "eV", "eV", "cal/mol K",
    "eV", "eV", "eV", "eV", "GHz", "GHz", "GHz",
)
#: the 15 properties of a QM9 ``gdb`` line, in order, native units
NATIVE_KEYS = ("A", "B", "C", "mu", "alpha", "homo", "lumo", "gap", "r2", "zpve", "U0", "U", "H", "G", "Cv")


@dataclass
class Record:
    """One molecule: gdb ``index`` (1..133885), ``z`` [n], ``pos`` [n, 3] in A.

    ``native``: the 15 ``gdb``-line properties in QM9 units (see
    :data:`NATIVE_KEYS`), or None; ``pyg_targets``: the 19 PyG numbers when a
    source provides them directly (PyG's CSV), else None.
    """

    index: int
    z: np.ndarray
    pos: np.ndarray
    native: Optional[np.ndarray] = None
    pyg_targets: Optional[np.ndarray] = None
    smiles: str = ""
    inchi: str = ""
    charges: Optional[np.ndarray] = None
    frequencies: Optional[np.ndarray] = None


_REF_TABLE = np.zeros((10, 4))
for _z, _refs in B3LYP_ATOM_ENERGIES.items():
    _REF_TABLE[_z] = _refs


def atomisation_hartree(native: np.ndarray, z: np.ndarray) -> np.ndarray:
    """U0, U, H, G minus the free-atom B3LYP energies, Hartree [4]."""
    return native[10:14] - _REF_TABLE[z].sum(axis=0)


# native[3:15] = mu, alpha, homo, lumo, gap, r2, zpve, U0, U, H, G, cv -> PyG targets 0-11
_NATIVE_CONV = np.array([1, 1, HAR2EV, HAR2EV, HAR2EV, 1, HAR2EV, HAR2EV, HAR2EV, HAR2EV, HAR2EV, 1], dtype=np.float64)


def to_pyg_targets(native: np.ndarray, z: np.ndarray) -> np.ndarray:
    """QM9 native properties -> PyG's 19 targets (order :data:`TARGET_NAMES`, units :data:`TARGET_UNITS`).

    Energies (homo, lumo, gap, zpve, U0, U, H, G) are Hartree x 27.211386246;
    the atomisation energies 12-15 are (E - sum of free-atom B3LYP energies)
    x 27.211386246 (PyG's CSV gives them in kcal/mol, x 0.04336414; the two
    agree to ~1e-5 eV).
    """
    native = np.asarray(native, dtype=np.float64)
    out = np.empty(19, dtype=np.float64)
    out[0:12] = native[3:15] * _NATIVE_CONV
    out[12:16] = atomisation_hartree(native, z) * HAR2EV
    out[16:19] = native[0:3]
    return out


def pyg_csv_to_targets(values: Sequence[float]) -> np.ndarray:
    """PyG's ``gdb9.sdf.csv`` 19 numbers -> targets, exactly as PyG converts them."""
    v = np.asarray(values, dtype=np.float64)
    v = np.concatenate([v[3:], v[:3]])  # rotational constants to the end
    conv = np.array([1, 1, HAR2EV, HAR2EV, HAR2EV, 1, HAR2EV, HAR2EV, HAR2EV, HAR2EV, HAR2EV, 1,
                     KCALMOL2EV, KCALMOL2EV, KCALMOL2EV, KCALMOL2EV, 1, 1, 1], dtype=np.float64)
    return v * conv


def _float(text: str) -> float:
    """Float that also reads Mathematica's ``1.2*^-5``."""
    return float(text.replace("*^", "e"))


# --------------------------------------------------------------------------- qm9pack CSV


def qm9pack_data_dir() -> Optional[str]:
    """The installed ``qm9pack/data`` folder (found without importing qm9pack), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("qm9pack")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        d = os.path.join(base, "data")
        if glob.glob(os.path.join(d, "qm9_part*.csv")):
            return d
    return None


_QM9PACK_NATIVE_COLUMNS = (
    "RotA_GHz", "RotB_GHz", "RotC_GHz", "Dipole_debye", "Polarizability_bohr3", "HOMO_au", "LUMO_au",
    "HOMO_LUMO_gap_au", "R2_bohr2", "ZPVE_au", "InternalEnergy_0K_au", "InternalEnergy_298K_au",
    "Enthalphy_298K_au", "GibbsFreeEnergy_298K_au", "Heatcapacity_Cv_cal_mol_K",
)
_STRIP = str.maketrans("", "", "[]'\" ")

#: molecules in the QM9 release (gdb indices 1..133,885)
QM9_RAW_SIZE = 133_885
#: qm9pack's files: (name, first gdb index, last gdb index, molecules); together
#: the 130,831 characterised molecules, sorted by index (checked against the
#: installed files in tests/test_data_qm9.py)
QM9PACK_PARTS = (
    ("qm9_part1.csv", 1, 44_746, 43_610),
    ("qm9_part2.csv", 44_747, 89_008, 43_611),
    ("qm9_part3.csv", 89_009, 133_885, 43_610),
)
#: the whole release as one part (PyG raw folder, xyz tarball or folder)
QM9_RELEASE_PART = (("the QM9 release", 1, QM9_RAW_SIZE, 130_831),)
#: a part whose rows are exactly the first >= this many molecules of a
#: qm9pack part is taken for a copy of that part (a hand-made selection is not)
_PART_PREFIX_MIN = 100


@functools.lru_cache(maxsize=1)
def _characterised() -> np.ndarray:
    """Sorted gdb indices of the 130,831 characterised molecules."""
    return np.setdiff1d(np.arange(1, QM9_RAW_SIZE + 1), np.fromiter(shipped_uncharacterized(), dtype=np.int64))


def qm9_gaps(index: np.ndarray, files: Sequence[str], parts=QM9PACK_PARTS) -> List[str]:
    """What a QM9 source lacks: one line per cut or missing part (default: qm9pack's three files).

    ``index``: sorted gdb indices loaded. A part whose loaded molecules are the
    first ones (at least 100) of its index range is a copy of that part; if it
    has fewer than the part holds, the file was cut (at a row boundary:
    a cut inside a row is a parse error). When any part is such a copy, a
    part with no molecules at all is missing. A hand-made selection (no part
    is a prefix) gives no lines.
    """
    index = np.asarray(index, dtype=np.int64)
    known = _characterised()
    by_name = {os.path.basename(f): f for f in files}
    copies, lines = 0, []
    for name, lo, hi, count in parts:
        got = index[(index >= lo) & (index <= hi)]
        part = known[(known >= lo) & (known <= hi)]
        where = by_name.get(name, f"qm9pack's {name}" if name.endswith(".csv") else name)
        if len(got) >= min(count, _PART_PREFIX_MIN) and np.array_equal(got, part[: len(got)]):
            copies += 1
            if len(got) < count:
                lines.append(f"{where}: {len(got):,} of {count:,} molecules (gdb {lo}-{int(got[-1])}; it "
                             f"ends at {hi}): cut short")
        elif len(got) == 0:
            state = "has no molecules" if name in by_name else "is missing"
            lines.append(f"{where} {state} (gdb {lo}-{hi}, {count:,} molecules)")
    return lines if copies else []


def _read_text(path: str) -> str:
    """The whole file as text; bytes that are not UTF-8 name the file and line."""
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{path}, line {line}: not text (byte {data[exc.start:exc.start + 1]!r} at offset {exc.start} is not "
            "UTF-8): binary garbage, the file is corrupt. Fix: copy it again (the installed copy: "
            "pip install --force-reinstall --no-deps qm9pack)"
        ) from None


def _qm9pack_record(row: List[str], col: Dict[str, int], native_cols: List[int]) -> Record:
    symbols = row[col["Elements"]].translate(_STRIP).split(",")
    z = np.array([SYMBOL_TO_Z[s] for s in symbols], dtype=np.int64)
    pos = np.array([float(v) for v in row[col["XYZ_Ang"]].translate(_STRIP).split(",")]).reshape(-1, 3)
    if pos.shape[0] != z.shape[0]:
        raise ValueError(f"{pos.shape[0]} positions for {z.shape[0]} elements")
    native = np.array([float(row[c]) for c in native_cols], dtype=np.float64)
    return Record(index=int(row[col["Index"]]), z=z, pos=pos, native=native,
                  smiles=row[col["SMILES"]] if "SMILES" in col else "",
                  inchi=row[col["InChi"]] if "InChi" in col else "")


def read_qm9pack_csv(files: Sequence[str]) -> Iterator[Record]:
    """Records from qm9pack-format CSV files (``qm9_part*.csv``).

    A malformed row, bytes that are not text, or a last row cut short raise
    ``ValueError`` naming the file and line.
    """
    csv.field_size_limit(1 << 26)
    for path in files:
        with io.StringIO(_read_text(path), newline="") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise ValueError(f"{path}: empty CSV file") from None
            except csv.Error as exc:
                raise ValueError(f"{path}, line 1: not a CSV header ({exc})") from None
            col = {name: i for i, name in enumerate(header)}
            missing = [c for c in ("Index", "Elements", "XYZ_Ang", *_QM9PACK_NATIVE_COLUMNS) if c not in col]
            if missing:
                raise ValueError(f"{path}: not a qm9pack CSV, missing columns {missing}")
            native_cols = [col[c] for c in _QM9PACK_NATIVE_COLUMNS]
            rows = iter(reader)
            while True:
                try:
                    row = next(rows)
                except StopIteration:
                    break
                except csv.Error as exc:
                    raise ValueError(f"{path}, line {reader.line_num}: malformed CSV ({exc}); the file is corrupt") from None
                try:
                    rec = _qm9pack_record(row, col, native_cols)
                except (ValueError, KeyError, IndexError) as exc:
                    line = reader.line_num
                    last = " It is the last line: the file was cut short (an interrupted copy?)." if _at_end(rows) else ""
                    raise ValueError(f"{path}, line {line}: malformed qm9pack row ({type(exc).__name__}: {exc}).{last}"
                                     " Fix: copy the file again") from None
                yield rec


def _at_end(rows: Iterator[List[str]]) -> bool:
    try:
        return next(rows, None) is None
    except (csv.Error, ValueError):
        return False


# --------------------------------------------------------------------------- PyG raw


def read_uncharacterized(path: str) -> Set[int]:
    """gdb indices listed in QM9's ``uncharacterized.txt`` (lines starting with an integer)."""
    out: Set[int] = set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if parts and parts[0].isdigit() and 1 <= int(parts[0]) <= 133885:
                out.add(int(parts[0]))
    return out


def shipped_uncharacterized() -> Set[int]:
    """The 3,054 uncharacterised indices shipped with est (``est/data/assets``)."""
    path = os.path.join(os.path.dirname(__file__), "assets", "qm9_uncharacterized.txt")
    with open(path, encoding="utf-8") as fh:
        return {int(line) for line in fh if line.strip() and not line.startswith("#")}


def _iter_sdf_blocks(path: str) -> Iterator[Tuple[int, List[str]]]:
    block: List[str] = []
    lineno = 0
    start = 1
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.startswith("$$$$"):
                yield start, block
                block = []
                start = lineno + 1
            else:
                block.append(line.rstrip("\r\n"))
    if any(l.strip() for l in block):
        yield start, block


def parse_sdf_block(lines: List[str], where: str = "") -> Tuple[str, np.ndarray, np.ndarray]:
    """One V2000 molfile -> (name, z [n], pos [n, 3]). Bonds and properties are skipped."""
    if len(lines) < 4:
        raise ValueError(f"{where}: molfile shorter than its 4-line header")
    counts = lines[3]
    if "V3000" in counts:
        raise ValueError(f"{where}: V3000 molfiles are not supported (gdb9.sdf is V2000)")
    try:
        n = int(counts[0:3])
    except ValueError:
        raise ValueError(f"{where}: bad counts line {counts!r}") from None
    if len(lines) < 4 + n:
        raise ValueError(f"{where}: counts line says {n} atoms but the block has {len(lines) - 4} lines")
    z = np.empty(n, dtype=np.int64)
    pos = np.empty((n, 3), dtype=np.float64)
    for i in range(n):
        line = lines[4 + i]
        try:
            pos[i] = (float(line[0:10]), float(line[10:20]), float(line[20:30]))
            sym = line[31:34].strip()
        except ValueError:  # not fixed-width: fall back to whitespace
            parts = line.split()
            pos[i] = [float(v) for v in parts[:3]]
            sym = parts[3]
        try:
            z[i] = SYMBOL_TO_Z[sym]
        except KeyError:
            raise ValueError(f"{where}: atom {i + 1} has element {sym!r}, not one of H C N O F") from None
    return lines[0].strip(), z, pos


def read_pyg_raw(folder: str, *, exclude: Optional[Set[int]] = None) -> Iterator[Record]:
    """Records from PyG's raw QM9 folder (``gdb9.sdf`` + ``gdb9.sdf.csv``).

    SDF blocks and CSV rows are paired in order (as PyG does); the CSV's
    ``mol_id`` (``gdb_N``) gives the index, and an SDF name of the form
    ``gdb_N`` must agree with it. Indices in ``exclude`` are skipped.
    """
    sdf = os.path.join(folder, "gdb9.sdf")
    csv_path = os.path.join(folder, "gdb9.sdf.csv")
    for p in (sdf, csv_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: missing (a PyG QM9 raw folder has gdb9.sdf, gdb9.sdf.csv, uncharacterized.txt)")
    exclude = exclude or set()
    with open(csv_path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or len(header) < 20:
            raise ValueError(f"{csv_path}: expected a header with mol_id and 19 columns, got {header}")
        rows = list(reader)
    blocks = _iter_sdf_blocks(sdf)
    for k, row in enumerate(rows):
        where_csv = f"{csv_path}, line {k + 2}"
        try:
            start, block = next(blocks)
        except StopIteration:
            raise ValueError(f"{sdf}: has {k} molecules but {csv_path} has {len(rows)} rows") from None
        m = re.search(r"(\d+)$", row[0].strip())
        if not m:
            raise ValueError(f"{where_csv}: bad mol_id {row[0]!r}")
        index = int(m.group(1))
        if index in exclude:
            continue
        where = f"{sdf}, line {start}"
        name, z, pos = parse_sdf_block(block, where)
        mn = re.fullmatch(r"gdb_?(\d+)", name)
        if mn and int(mn.group(1)) != index:
            raise ValueError(f"{where}: molecule {name!r} is paired with {row[0]!r} of {csv_path}; the files are out of step")
        try:
            values = [float(v) for v in row[1:20]]
        except ValueError as exc:
            raise ValueError(f"{where_csv}: {exc}") from None
        yield Record(index=index, z=z, pos=pos, pyg_targets=pyg_csv_to_targets(values))
    if next(blocks, None) is not None:
        raise ValueError(f"{sdf}: has more molecules than the {len(rows)} rows of {csv_path}")


# --------------------------------------------------------------------------- xyz release


def parse_xyz(text: str, where: str = "") -> Record:
    """One ``dsgdb9nsd_NNNNNN.xyz`` file (handles ``*^`` exponents)."""
    lines = text.splitlines()
    try:
        n = int(lines[0].strip())
        props = lines[1].split()
        if props[0] != "gdb":
            raise ValueError(f"second line starts with {props[0]!r}, not 'gdb'")
        index = int(props[1])
        native = np.array([_float(v) for v in props[2:17]], dtype=np.float64)
        if native.shape[0] != 15:
            raise ValueError(f"gdb line has {native.shape[0]} properties, expected 15")
        z = np.empty(n, dtype=np.int64)
        pos = np.empty((n, 3), dtype=np.float64)
        charges = np.empty(n, dtype=np.float64)
        for i in range(n):
            parts = lines[2 + i].split()
            z[i] = SYMBOL_TO_Z[parts[0]]
            pos[i] = [_float(v) for v in parts[1:4]]
            charges[i] = _float(parts[4]) if len(parts) > 4 else np.nan
        freqs = np.array([_float(v) for v in lines[2 + n].split()]) if len(lines) > 2 + n else None
        smiles = lines[3 + n].split()[0] if len(lines) > 3 + n and lines[3 + n].split() else ""
        inchi = lines[4 + n].split()[0] if len(lines) > 4 + n and lines[4 + n].split() else ""
    except (ValueError, IndexError, KeyError) as exc:
        raise ValueError(f"{where}: malformed QM9 xyz file ({type(exc).__name__}: {exc})") from None
    return Record(index=index, z=z, pos=pos, native=native, smiles=smiles, inchi=inchi,
                  charges=charges, frequencies=freqs)


def read_xyz_tar(path: str, *, exclude: Optional[Set[int]] = None) -> Iterator[Record]:
    """Records from ``dsgdb9nsd.xyz.tar.bz2`` (any tar compression), in archive order.

    An archive that ends early (an interrupted download) raises ``ValueError``
    naming the file and how many molecules were read.
    """
    exclude = exclude or set()
    try:
        tf = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"{path}: cannot open as a tar archive ({exc})") from None
    read = 0
    with tf:
        members = iter(tf)
        while True:
            try:
                member = next(members, None)
                if member is None:
                    return
                if not member.isfile() or not member.name.endswith(".xyz"):
                    continue
                m = re.search(r"(\d+)\.xyz$", member.name)
                if m and int(m.group(1)) in exclude:
                    continue
                text = tf.extractfile(member).read().decode("utf-8", errors="replace")
            except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
                raise ValueError(f"{path}: the archive is cut short or corrupt after {read:,} molecules "
                                 f"({type(exc).__name__}: {exc}). Fix: download or copy it again") from None
            read += 1
            rec = parse_xyz(text, where=f"{path}:{member.name}")
            if rec.index not in exclude:
                yield rec


def read_xyz_folder(folder: str, *, exclude: Optional[Set[int]] = None) -> Iterator[Record]:
    """Records from an extracted folder of ``*.xyz`` files."""
    exclude = exclude or set()
    files = sorted(glob.glob(os.path.join(folder, "*.xyz")))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.xyz files")
    for f in files:
        m = re.search(r"(\d+)\.xyz$", f)
        if m and int(m.group(1)) in exclude:
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            rec = parse_xyz(fh.read(), where=f)
        if rec.index not in exclude:
            yield rec


# --------------------------------------------------------------------------- writers (tests, export)


def _mathematica(v: float) -> str:
    """Format like the QM9 release: small magnitudes in ``*^`` notation."""
    if v != 0.0 and abs(v) < 1e-3:
        mant, exp = f"{v:.12e}".split("e")
        return f"{mant.rstrip('0').rstrip('.')}*^{int(exp)}"
    return repr(float(v))


def format_xyz(rec: Record) -> str:
    """A QM9-release-style xyz text for ``rec`` (needs ``rec.native``)."""
    if rec.native is None:
        raise ValueError("format_xyz needs native QM9 properties")
    lines = [str(len(rec.z))]
    lines.append("gdb %d\t" % rec.index + "\t".join(_mathematica(v) for v in rec.native) + "\t")
    charges = rec.charges if rec.charges is not None else np.zeros(len(rec.z))
    for zi, p, q in zip(rec.z, rec.pos, charges):
        lines.append("\t".join([Z_TO_SYMBOL[int(zi)], *(_mathematica(x) for x in p), _mathematica(q)]))
    freqs = rec.frequencies if rec.frequencies is not None else np.zeros(0)
    lines.append("\t".join(repr(float(f)) for f in freqs))
    lines.append(f"{rec.smiles}\t{rec.smiles}")
    lines.append(f"{rec.inchi}\t{rec.inchi}")
    return "\n".join(lines) + "\n"


def write_xyz_folder(records: Iterable[Record], folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for rec in records:
        with open(os.path.join(folder, f"dsgdb9nsd_{rec.index:06d}.xyz"), "w") as fh:
            fh.write(format_xyz(rec))


def write_xyz_tar(records: Iterable[Record], path: str) -> None:
    """Write records as a ``dsgdb9nsd.xyz.tar.bz2``-style archive."""
    with tarfile.open(path, "w:bz2") as tf:
        for rec in records:
            data = format_xyz(rec).encode()
            info = tarfile.TarInfo(f"dsgdb9nsd_{rec.index:06d}.xyz")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


_COVALENT = {1: 0.31, 6: 0.76, 7: 0.71, 8: 0.66, 9: 0.57}


def write_pyg_raw(records: Iterable[Record], folder: str, *, uncharacterized: Iterable[int] = ()) -> None:
    """Write records as PyG's raw folder (``gdb9.sdf``, ``gdb9.sdf.csv``, ``uncharacterized.txt``).

    Bonds are guessed from covalent radii (the reader skips them). The CSV's
    atomisation energies are written in kcal/mol like the published file.
    """
    os.makedirs(folder, exist_ok=True)
    sdf_lines: List[str] = []
    csv_rows = []
    for rec in records:
        n = len(rec.z)
        bonds = []
        for i in range(n):
            for j in range(i + 1, n):
                d = float(np.linalg.norm(rec.pos[i] - rec.pos[j]))
                if d < 1.2 * (_COVALENT[int(rec.z[i])] + _COVALENT[int(rec.z[j])]):
                    bonds.append((i + 1, j + 1))
        sdf_lines += [f"gdb_{rec.index}", "     est      3D", ""]
        sdf_lines.append(f"{n:3d}{len(bonds):3d}  0  0  0  0  0  0  0  0999 V2000")
        for zi, p in zip(rec.z, rec.pos):
            sdf_lines.append(f"{p[0]:10.4f}{p[1]:10.4f}{p[2]:10.4f} {Z_TO_SYMBOL[int(zi)]:<3} 0  0  0  0  0  0  0  0  0  0  0  0")
        for a, b in bonds:
            sdf_lines.append(f"{a:3d}{b:3d}  1  0")
        sdf_lines += ["M  END", "$$$$"]
        nat = rec.native
        atom_kcal = atomisation_hartree(nat, rec.z) * HAR2KCALMOL
        csv_rows.append([f"gdb_{rec.index}", *(repr(float(v)) for v in nat), *(repr(float(v)) for v in atom_kcal)])
    with open(os.path.join(folder, "gdb9.sdf"), "w") as fh:
        fh.write("\n".join(sdf_lines) + "\n")
    with open(os.path.join(folder, "gdb9.sdf.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["mol_id", "A", "B", "C", "mu", "alpha", "homo", "lumo", "gap", "r2", "zpve", "u0", "u298",
                    "h298", "g298", "cv", "u0_atom", "u298_atom", "h298_atom", "g298_atom"])
        w.writerows(csv_rows)
    unc = sorted(set(uncharacterized))
    with open(os.path.join(folder, "uncharacterized.txt"), "w") as fh:
        fh.write("Molecules that failed the geometry consistency check (test file written by est)\n")
        fh.write("     Index\n")
        for i in unc:
            fh.write(f"{i:10d}\n")

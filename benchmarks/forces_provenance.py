"""Which GFN2-xTB sets the force study's stored runs trained on, and whether a data folder still holds them.

``benchmarks/results/forces.json`` keeps ``data_manifest``: the generator's manifest (``python -m est.data.xtb``)
with one entry per molecule. A run of the study on a data folder is merged with the stored runs only when the
folder's set of each molecule is the stored one: equal frames, skipped frames and seed sequences of both splits,
and equal energy mean and spread, force RMS and relaxed energy to ``SET_RTOL`` (tblite's forces move in the 11th
digit between machines, so a set regenerated elsewhere is the same set). A molecule's folder may be a link into
another generation's folder (``DIR/aspirin -> ../xtb_asp/aspirin``): its manifest is the one beside the folder
it resolves to. No training, no tables.
"""
from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

from forces_setup import molecule_dir

#: per split: fields that must be equal, and fields equal to SET_RTOL
SPLIT_EXACT = ("frames", "skipped_frames", "seed_sequence")
SPLIT_CLOSE = ("energy_mean_eV", "energy_std_eV", "force_rms_eV_per_A")
SET_RTOL = 1e-8
#: a generation's settings, recorded with a molecule added from another generation where they differ
GENERATION = ("method", "calculator", "config", "md", "versions")


def molecule_manifest(data_dir: Path, molecule: str) -> tuple[Path, dict]:
    """(path, manifest) of the generation that holds ``molecule``'s set in ``data_dir``; the manifest has an entry
    ``molecules[molecule]``."""
    folder = molecule_dir(data_dir, molecule).resolve().parent
    path = folder / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: the generator writes it last, so {molecule}'s set in {folder} "
                                f"is unfinished. Fix: `python -m est.data.xtb --out {folder} --molecules {molecule}` "
                                "resumes it")
    manifest = json.loads(path.read_text())
    if molecule not in manifest.get("molecules", {}):
        raise ValueError(f"{path} has no entry for {molecule} (it lists {sorted(manifest.get('molecules', {}))}). "
                         f"Fix: regenerate with `python -m est.data.xtb --out {folder} --molecules {molecule}`")
    return path, manifest


def set_differences(stored: dict, current: dict) -> list[str]:
    """How two manifest entries of one molecule differ (``"train energy_mean_eV: a -> b"``); empty when they
    describe the same set."""
    out = []
    a, b = stored.get("relaxed", {}).get("energy_eV"), current.get("relaxed", {}).get("energy_eV")
    if a is not None and not _close(a, b):
        out.append(f"relaxed energy_eV: {a} -> {b}")
    for split in sorted(set(stored.get("splits", {})) | set(current.get("splits", {}))):
        s, c = stored.get("splits", {}).get(split), current.get("splits", {}).get(split)
        if s is None or c is None:
            out.append(f"{split}: {'absent' if s is None else 'present'} -> {'absent' if c is None else 'present'}")
            continue
        out += [f"{split} {k}: {s.get(k)} -> {c.get(k)}" for k in SPLIT_EXACT if s.get(k) != c.get(k)]
        out += [f"{split} {k}: {s.get(k)} -> {c.get(k)}" for k in SPLIT_CLOSE if not _close(s.get(k), c.get(k))]
    return out


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=SET_RTOL, abs_tol=0.0)


def checked_manifest(stored: dict | None, data_dir: Path, molecules: list[str]) -> tuple[dict, dict[str, str]]:
    """The study's ``data_manifest`` after a run on ``molecules`` in ``data_dir``: ``stored`` (the manifest of the
    stored runs; None for a first run) with an entry added for each molecule it lacks; and, per molecule, the
    manifest it was checked against. Raises SystemExit, naming the fields, when a molecule's set in ``data_dir``
    is not its stored one: its runs cannot be merged with the stored ones."""
    manifest = copy.deepcopy(stored) if stored else None
    checked = {}
    for molecule in molecules:
        path, current = molecule_manifest(data_dir, molecule)
        entry = current["molecules"][molecule]
        if manifest is None:
            manifest = {**copy.deepcopy(current), "molecules": {}}
        old = manifest.setdefault("molecules", {}).get(molecule)
        if old is None:  # new here: with what of its generation's settings differs from the manifest's
            differs = {k: current[k] for k in GENERATION if k in current and current[k] != manifest.get(k)}
            manifest["molecules"][molecule] = copy.deepcopy(entry) | ({"generation": differs} if differs else {})
        elif diffs := set_differences(old, entry):
            raise SystemExit(f"[forces] {molecule}'s set in {data_dir} ({path}) is not the one the stored runs in "
                             f"benchmarks/results/forces.json trained on: {'; '.join(diffs)}. Fix: pass the "
                             "--data-dir of that set, regenerate it from its manifest, or move forces.json away to "
                             "start a new study")
        checked[molecule] = str(path)
    return manifest or {}, checked


def check_record(checked: dict[str, str]) -> dict[str, dict]:
    """``data_checks`` entries: per molecule, when and against which manifest its set was found to be the stored
    one."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {molecule: {"utc": when, "manifest": path, "rel_tol": SET_RTOL} for molecule, path in checked.items()}

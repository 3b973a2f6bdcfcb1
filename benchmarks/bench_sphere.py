"""Spherical Fourier transform: exactness, SiLU equivariance, speed vs e3nn.

For each L and point set: the linear round-trip error and the equivariance
error of SiLU applied on the sphere (float64, 64 channels, grid values of
unit variance, worst of several random rotations), and the time of
to_sphere + from_sphere (float32, 1000 atoms, 128 channels, forward and
forward + backward) next to e3nn's ToS2Grid/FromS2Grid on the same grid in
the same run.

    python benchmarks/bench_sphere.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, rel_equivariance_error, save, setup_threads  # noqa: E402

from est.so3 import random_rotation, wigner_D  # noqa: E402
from est.sphere import SphericalFourierTransform, default_num_points  # noqa: E402
from est.sphere.designs import available_designs  # noqa: E402


def point_sets(L: int):
    S0 = default_num_points(L)
    sets = [
        ("fibonacci (paper)", dict(kind="fibonacci", normalization="lambda")),
        ("fibonacci (code)", dict(kind="fibonacci", normalization="column")),
        ("fibonacci 2S", dict(kind="fibonacci", num_points=2 * S0, normalization="lambda")),
        ("gauss-legendre min", dict(kind="gauss-legendre")),
        ("equiangular min", dict(kind="equiangular")),
    ]
    if L == 6:
        sets.append(("equiangular 18x18 (EqV2)", dict(kind="equiangular", resolution=(18, 18))))
    sizes = {n for t, n, _ in available_designs()}
    if S0 in sizes:
        sets.append((f"design S={S0} (= paper S)", dict(kind="design", num_points=S0)))
    degrees = {t for t, _, _ in available_designs()}
    for t in (2 * L, 3 * L, 4 * L):
        if any(d >= t for d in degrees):
            sets.append((f"design t={t}", dict(kind="design", degree=t)))
    return sets


def silu_on_sphere(sft):
    return lambda x: sft.from_sphere(torch.nn.functional.silu(sft.to_sphere(x)))


def accuracy_row(L: int, name: str, kw: dict, channels: int = 64) -> dict:
    sft = SphericalFourierTransform(L, **kw).double()
    g = torch.Generator().manual_seed(L)
    x = torch.randn(8, (L + 1) ** 2, channels, dtype=torch.float64, generator=g)
    x = x / sft.to_sphere(x).std()  # unit-variance grid values
    Ds = wigner_D(L, random_rotation(4, generator=g))
    lin = float((sft(x) - x).norm() / x.norm())
    return dict(L=L, points=name, S=sft.num_points, round_trip=lin, silu_equivariance=rel_equivariance_error(silu_on_sphere(sft), x, Ds))


def timing_row(L: int, atoms: int, channels: int, repeats: int) -> dict:
    from e3nn import o3

    res = (2 * (L + 1), 2 * L + 1)
    sft = SphericalFourierTransform(L, kind="equiangular", resolution=res)
    to, fro = o3.ToS2Grid(L, res), o3.FromS2Grid(res, L)
    x = torch.randn(atoms, (L + 1) ** 2, channels, requires_grad=True)
    xe = x.detach().transpose(1, 2).contiguous().requires_grad_(True)  # e3nn wants [..., K]

    def ours():
        return sft.from_sphere(sft.to_sphere(x))

    def theirs():
        return fro(to(xe))

    def ours_bwd():
        ours().sum().backward()

    def theirs_bwd():
        theirs().sum().backward()

    t = {k: median_time(f, repeats=repeats) for k, f in
         dict(ours=ours, e3nn=theirs, ours_bwd=ours_bwd, e3nn_bwd=theirs_bwd).items()}
    return dict(
        L=L, S=sft.num_points, atoms=atoms, channels=channels,
        est_fwd_ms=1e3 * t["ours"], e3nn_fwd_ms=1e3 * t["e3nn"], fwd_speedup=t["e3nn"] / t["ours"],
        est_fwdbwd_ms=1e3 * t["ours_bwd"], e3nn_fwdbwd_ms=1e3 * t["e3nn_bwd"], fwdbwd_speedup=t["e3nn_bwd"] / t["ours_bwd"],
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="L=4 only, fewer repeats")
    args = ap.parse_args(argv)
    threads = setup_threads()
    Ls = [4] if args.quick else [4, 6, 8]
    acc = [accuracy_row(L, name, kw) for L in Ls for name, kw in point_sets(L)]
    print_table(acc, ["L", "points", "S", "round_trip", "silu_equivariance"],
                "Spherical Fourier transform accuracy (float64, relative errors)")
    times = [timing_row(L, 1000, 128, 3 if args.quick else 7) for L in Ls]
    print_table(times, ["L", "S", "est_fwd_ms", "e3nn_fwd_ms", "fwd_speedup", "est_fwdbwd_ms", "e3nn_fwdbwd_ms", "fwdbwd_speedup"],
                f"to_sphere + from_sphere vs e3nn ToS2Grid/FromS2Grid (float32, 1000 atoms x 128 channels, {threads} threads, median)")
    save("sphere", dict(accuracy=acc, timing=times))


if __name__ == "__main__":
    main()

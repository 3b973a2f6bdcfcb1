#!/usr/bin/env python
"""Compute spherical t-designs offline (float64) and write ``est/sphere/data/designs.npz``.

A spherical t-design is a set of N unit vectors p_1..p_N such that

    (1/N) sum_s f(p_s) = (1/4pi) int_{S^2} f dOmega     for every polynomial f of degree <= t,

equivalently r_lm = sum_s Y_lm(p_s) = 0 for every l = 1..t and m = -l..l (any
orthonormal basis of the harmonics; the l = 0 term is N / sqrt(4 pi) and is exact).

Method (docs: est-method.md, section 2), for each (t, N) and several fixed seeds:

1. Stage 1 (global): minimise the Legendre-addition-theorem energy

       E(p) = sum_{l=1..t} (2l+1)/(4pi) sum_{s,s'} P_l(p_s . p_s') = |r|^2   (>= 0, = 0 iff design)

   with L-BFGS (scipy) over unconstrained 3-vectors v_s, p_s = v_s / |v_s|, from a random
   start, until E < 0.1 (the basin of a design; Gauss-Newton then converges fast, while L-BFGS
   would need thousands more iterations and stalls near 1e-10 because the N^2 terms cancel).
   A start that stalls above 0.1 is a local minimum that is not a design and is discarded.
2. Stage 2 (local): nonlinear least squares on the residual vector r(p) in R^{(t+1)^2 - 1}
   with scipy's trust-region reflective solver ('trf', exact subproblem) and the exact
   Jacobian dr_k/dv_s = (1/|v_s|) (I - p_s p_s^T) grad Y_k(p_s), each point moving in its
   tangent plane (2N unknowns). This reaches |r| ~ 1e-14 (t ~ 10) .. 3e-13 (t = 30), the
   rounding floor of summing N harmonics.

The real harmonics are built here from the fully normalised associated Legendre
recursion, written as Y_lm = q_l^m(z) * Re/Im (x + i y)^m so that they (and their
gradients) are polynomials in (x, y, z) with no pole singularity (polar axis z; the
orientation is irrelevant: |r| is invariant under rotations and unitary changes of basis).
The shipped residual is re-measured independently with scipy's complex spherical harmonics.

For every t = 1..T_MAX the script searches N upward from a lower bound and ships the
smallest N for which one of the fixed seeds converges to |r| < 1e-12 (see task_min_n for
where the search starts; smaller designs can exist, e.g. Hardin-Sloane's 84-point 12-design). It also ships the
sizes used in our measurements: (12, 100), (18, 182), (24, 320) and, for N = (2L+1)(2L+2),
L = 2..8, the largest t that converges with exactly N points.

Takes ~15 minutes on 2 busy cores (t = 30, N = 482 alone ~3 minutes).

Usage:  python scripts/make_designs.py [--tmax 30] [--workers 2] [--out est/sphere/data/designs.npz]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy import optimize, special  # noqa: E402

TOL = 1e-12  # acceptance threshold on |r|
FOUR_PI = 4.0 * math.pi


# ----------------------------------------------------------------------------- harmonics
def real_sh_with_grad(p: np.ndarray, t: int, grad: bool = True):
    """Orthonormal real spherical harmonics of degree 1..t at unit vectors ``p`` [N, 3].

    Y_l0 = q_l^0(z),  Y_lm = sqrt(2) q_l^m(z) Re (x+iy)^m,  Y_l,-m = sqrt(2) q_l^m(z) Im (x+iy)^m,
    with q_l^m(z) = N_lm d^m P_l / dz^m, N_lm = sqrt((2l+1)/(4pi) (l-m)!/(l+m)!), computed by
        q_m^m = sqrt((2m+1)/(2m)) q_{m-1}^{m-1},  q_0^0 = 1/sqrt(4pi),
        q_{m+1}^m = sqrt(2m+3) z q_m^m,
        q_l^m = a_lm (z q_{l-1}^m - b_lm q_{l-2}^m),
        a_lm = sqrt((4l^2-1)/(l^2-m^2)),  b_lm = sqrt(((l-1)^2-m^2)/(4(l-1)^2-1)),
    and d q_l^m / dz = sqrt((l-m)(l+m+1)) q_l^{m+1}.  (On the sphere (x+iy)^m = sin^m(theta) e^{i m phi}.)

    Returns Y [N, K] (K = (t+1)^2 - 1, index l*l + l + m - 1) and, if ``grad``, the
    Euclidean gradient G [N, K, 3] of this polynomial extension (project it to the tangent
    plane before use).
    """
    n = p.shape[0]
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    # q[l][m] arrays of shape [N]
    q = [[None] * (t + 2) for _ in range(t + 2)]
    q[0][0] = np.full(n, 1.0 / math.sqrt(FOUR_PI))
    for m in range(0, t + 1):
        if m > 0:
            q[m][m] = math.sqrt((2 * m + 1) / (2 * m)) * q[m - 1][m - 1]
        if m + 1 <= t:
            q[m + 1][m] = math.sqrt(2 * m + 3) * z * q[m][m]
        for l in range(m + 2, t + 1):
            a = math.sqrt((4 * l * l - 1) / (l * l - m * m))
            b = math.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
            q[l][m] = a * (z * q[l - 1][m] - b * q[l - 2][m])
    zero = np.zeros(n)
    # C_m + i S_m = (x + i y)^m
    C = [np.ones(n)]
    S = [np.zeros(n)]
    for m in range(1, t + 1):
        C.append(x * C[m - 1] - y * S[m - 1])
        S.append(x * S[m - 1] + y * C[m - 1])
    K = (t + 1) ** 2 - 1
    Y = np.empty((n, K))
    G = np.empty((n, K, 3)) if grad else None
    r2 = math.sqrt(2.0)
    for l in range(1, t + 1):
        for m in range(0, l + 1):
            qlm = q[l][m]
            dq = math.sqrt((l - m) * (l + m + 1)) * q[l][m + 1] if m < l else zero
            if m == 0:
                k = l * l + l - 1
                Y[:, k] = qlm
                if grad:
                    G[:, k, 0] = 0.0
                    G[:, k, 1] = 0.0
                    G[:, k, 2] = dq
                continue
            kc = l * l + l + m - 1
            ks = l * l + l - m - 1
            Y[:, kc] = r2 * qlm * C[m]
            Y[:, ks] = r2 * qlm * S[m]
            if grad:
                # d(x+iy)^m/dx = m (x+iy)^{m-1},  d/dy = i m (x+iy)^{m-1}
                G[:, kc, 0] = r2 * qlm * m * C[m - 1]
                G[:, kc, 1] = -r2 * qlm * m * S[m - 1]
                G[:, kc, 2] = r2 * dq * C[m]
                G[:, ks, 0] = r2 * qlm * m * S[m - 1]
                G[:, ks, 1] = r2 * qlm * m * C[m - 1]
                G[:, ks, 2] = r2 * dq * S[m]
    return Y, G


def independent_residual(p: np.ndarray, t: int) -> float:
    """|r| from scipy's complex spherical harmonics (a different code path from the solver).

    sum_{l=1..t} sum_m |sum_s Y_l^m(p_s)|^2 equals the real-basis |r|^2 (unitary change of basis).
    """
    p = p / np.linalg.norm(p, axis=1, keepdims=True)
    polar = np.arccos(np.clip(p[:, 2], -1.0, 1.0))
    azim = np.arctan2(p[:, 1], p[:, 0])
    total = 0.0
    for l in range(1, t + 1):
        for m in range(-l, l + 1):
            if hasattr(special, "sph_harm_y"):
                y = special.sph_harm_y(l, m, polar, azim)
            else:  # scipy < 1.15: sph_harm(m, l, azimuth, polar)
                y = special.sph_harm(m, l, azim, polar)
            total += abs(y.sum()) ** 2
    return math.sqrt(total)


# ----------------------------------------------------------------------------- stage 1
def legendre_energy_kernel(g: np.ndarray, t: int):
    """A(g) = sum_{l=1..t} (2l+1)/(4pi) P_l(g) and A'(g), by the three-term recursion and
    P'_{l+1} = P'_{l-1} + (2l+1) P_l."""
    p_prev, p_cur = np.ones_like(g), g.copy()  # P_0, P_1
    d_prev, d_cur = np.zeros_like(g), np.ones_like(g)  # P'_0, P'_1
    A = 3.0 * p_cur
    dA = 3.0 * d_cur
    for l in range(1, t):
        p_next = ((2 * l + 1) * g * p_cur - l * p_prev) / (l + 1)
        d_next = d_prev + (2 * l + 1) * p_cur
        p_prev, p_cur = p_cur, p_next
        d_prev, d_cur = d_cur, d_next
        A += (2 * l + 3) * p_cur
        dA += (2 * l + 3) * d_cur
    return A / FOUR_PI, dA / FOUR_PI


def energy_and_grad(v_flat: np.ndarray, t: int):
    v = v_flat.reshape(-1, 3)
    nv = np.linalg.norm(v, axis=1, keepdims=True)
    p = v / nv
    g = np.clip(p @ p.T, -1.0, 1.0)
    A, dA = legendre_energy_kernel(g, t)
    E = A.sum()
    gp = 2.0 * dA @ p  # dE/dp_s
    gv = (gp - np.sum(gp * p, axis=1, keepdims=True) * p) / nv
    return E, gv.ravel()


# ----------------------------------------------------------------------------- stage 2
def residual(v_flat: np.ndarray, t: int) -> np.ndarray:
    """r_k = sum_s Y_k(v_s / |v_s|), k over l = 1..t, all m.  [K]"""
    v = v_flat.reshape(-1, 3)
    p = v / np.linalg.norm(v, axis=1, keepdims=True)
    Y, _ = real_sh_with_grad(p, t, grad=False)
    return Y.sum(axis=0)


def jacobian(v_flat: np.ndarray, t: int) -> np.ndarray:
    """dr_k / dv_s = (1/|v_s|) (I - p_s p_s^T) grad Y_k(p_s).  [K, 3N]"""
    v = v_flat.reshape(-1, 3)
    nv = np.linalg.norm(v, axis=1, keepdims=True)
    p = v / nv
    _, G = real_sh_with_grad(p, t, grad=True)  # [N, K, 3]
    radial = np.einsum("nki,ni->nk", G, p)
    Gt = (G - radial[:, :, None] * p[:, None, :]) / nv[:, :, None]  # tangent part / |v|
    return Gt.transpose(1, 0, 2).reshape(G.shape[1], -1)  # [K, 3N]


def tangent_frame(p: np.ndarray):
    """Orthonormal tangent vectors e1, e2 [N, 3] at unit vectors p [N, 3]."""
    a = np.where(np.abs(p[:, :1]) < 0.6, np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 1.0, 0.0]]))
    e1 = a - np.sum(a * p, axis=1, keepdims=True) * p
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    return e1, np.cross(p, e1)


def refine(p0: np.ndarray, t: int, max_nfev: int = 150):
    """Stage 2: trust-region least squares on r with the exact Jacobian.

    Each point moves in its tangent plane, p_s = normalise(p0_s + a_s e1_s + b_s e2_s), so
    there are 2N unknowns and no radial null space (the SVD in the 'exact' trust-region
    subproblem is several times cheaper than with 3N unknowns).
    """
    e1, e2 = tangent_frame(p0)

    def points(x):
        x = x.reshape(-1, 2)
        return p0 + x[:, :1] * e1 + x[:, 1:] * e2  # [N, 3]

    def res(x):
        return residual(points(x).ravel(), t)

    def jac(x):
        J = jacobian(points(x).ravel(), t).reshape(-1, p0.shape[0], 3)  # [K, N, 3]
        return np.stack([np.einsum("kni,ni->kn", J, e1), np.einsum("kni,ni->kn", J, e2)], -1).reshape(J.shape[0], -1)

    out = optimize.least_squares(
        res, np.zeros(2 * p0.shape[0]), jac=jac, method="trf", tr_solver="exact",
        xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=max_nfev,
    )
    p = points(out.x)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    return p, float(np.linalg.norm(residual(p.ravel(), t))), out.nfev


def attempt(t: int, n: int, seed: int, verbose: bool = False, e_switch: float = 0.1):
    """One random start. Returns (points [n, 3] or None, |r| reached, seconds).

    Stage 1 runs L-BFGS on E until E < e_switch (then Gauss-Newton-type stage 2 converges
    fast) or until it stalls; a stall above e_switch is a local minimum that is not a design.
    """
    t0 = time.time()
    rng = np.random.default_rng(seed)
    v0 = rng.standard_normal((n, 3))
    v0 /= np.linalg.norm(v0, axis=1, keepdims=True)

    def stop(intermediate_result):
        if intermediate_result.fun < e_switch:
            raise StopIteration

    res1 = optimize.minimize(
        energy_and_grad, v0.ravel(), args=(t,), jac=True, method="L-BFGS-B", callback=stop,
        options={"maxiter": 4000, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-10},
    )
    p = res1.x.reshape(-1, 3)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    e1 = max(float(res1.fun), 0.0)
    if verbose:
        print(f"    t={t} n={n} seed={seed} stage1 E={e1:.3e} it={res1.nit} {time.time()-t0:.1f}s", flush=True)
    if e1 >= e_switch:
        return None, math.sqrt(e1), time.time() - t0
    r = math.inf
    for _ in range(3):  # re-centre the tangent frames and polish again if needed
        p, r, nfev = refine(p, t)
        if verbose:
            print(f"    t={t} n={n} seed={seed} stage2 |r|={r:.3e} nfev={nfev} {time.time()-t0:.1f}s", flush=True)
        if r < 0.3 * TOL or r > 1e-6:
            break
    return (p if r < TOL else None), r, time.time() - t0


def solve(t: int, n: int, seeds) -> tuple[np.ndarray | None, float]:
    best = math.inf
    for seed in seeds:
        p, r, _ = attempt(t, n, seed)
        best = min(best, r)
        if p is not None:
            return p, r
    return None, best


# ----------------------------------------------------------------------------- tasks
def count_bound(t: int) -> int:
    """Smallest N with 2N - 3 (free parameters modulo rotation) >= (t+1)^2 - 1 (equations).

    Generic (non-symmetric) designs are found from random starts at this size; it is also the
    size of Womersley's non-symmetric designs, N = ceil((t+1)^2 / 2) + 1.
    """
    return math.ceil(((t + 1) ** 2 + 2) / 2)


def delsarte_bound(t: int) -> int:
    """Proven lower bound on N (Delsarte-Goethals-Seidel): (e+1)^2 for t = 2e, (e+1)(e+2) for t = 2e+1."""
    e = t // 2
    return (e + 1) ** 2 if t % 2 == 0 else (e + 1) * (e + 2)


def task_min_n(t: int):
    """Smallest N (searched upward) for which one of the fixed seeds converges.

    t <= 8: from the Delsarte bound with 40 seeds (symmetric designs below the counting bound
    exist there, e.g. octahedron, icosahedron); 9 <= t <= 14: from count_bound - 2 with 4 seeds;
    t >= 15: from count_bound with 3 seeds (below it random starts essentially never converge and
    each failed start costs minutes).
    """
    t0 = time.time()
    if t <= 8:
        n, seeds = delsarte_bound(t), range(40)
    elif t <= 14:
        n, seeds = count_bound(t) - 2, range(4)
    else:
        n, seeds = count_bound(t), range(3)
    log = []
    while True:
        p, r = solve(t, n, [1000 * t + n * 7 + s for s in seeds])
        log.append((n, r))
        if p is not None:
            return ("min", t, n, p, time.time() - t0, log)
        n += 1


def task_fixed(t: int, n: int):
    t0 = time.time()
    p, r = solve(t, n, [7919 * t + n + s for s in range(6)])
    return ("fixed", t, n, p, time.time() - t0, [(n, r)])


def task_max_t(n: int):
    """Largest t with a converged N-point design, searched downward.

    Starts 2 above the largest t whose counting bound fits (20 seeds) for N <= 90, 1 above (2
    seeds) for larger N; then the counting-bound t with 6 seeds, and below.
    """
    t0 = time.time()
    t_count = max(tt for tt in range(1, 60) if count_bound(tt) <= n)
    t = t_count + (2 if n <= 90 else 1)
    log = []
    while t >= 1:
        k = (20 if n <= 90 else 2) if t > t_count else 6
        p, r = solve(t, n, [31 * n + 17 * t + s for s in range(k)])
        log.append((t, r))
        if p is not None:
            return ("maxt", t, n, p, time.time() - t0, log)
        t -= 1
    raise RuntimeError(f"no design found for N={n}")


def run_task(spec):
    kind, *args = spec
    fn = {"min": task_min_n, "fixed": task_fixed, "maxt": task_max_t}[kind]
    out = fn(*args)
    print(f"[{time.strftime('%H:%M:%S')}] done {spec}: t={out[1]} N={out[2]} "
          f"{'OK' if out[3] is not None else 'FAILED'} in {out[4]:.1f}s; tried {out[5]}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tmax", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "est", "sphere", "data", "designs.npz"))
    args = ap.parse_args(argv)

    specs = [("fixed", 12, 100), ("fixed", 18, 182), ("fixed", 24, 320)]
    specs += [("maxt", (2 * L + 1) * (2 * L + 2)) for L in range(2, 9)]
    specs += [("min", t) for t in range(1, args.tmax + 1)]
    specs.sort(key=lambda s: -(s[1] if s[0] != "maxt" else math.isqrt(2 * s[1])))  # big first

    t_start = time.time()
    designs: dict[tuple[int, int], np.ndarray] = {}
    if args.workers > 1:
        import multiprocessing as mp
        pool = mp.get_context("fork").Pool(args.workers)
        results = pool.imap_unordered(run_task, specs, chunksize=1)
    else:
        pool, results = None, map(run_task, specs)
    for kind, t, n, p, secs, log in results:
        if p is None:
            print(f"WARNING: ({kind}) t={t} N={n} did not converge; not shipped", file=sys.stderr)
            continue
        designs[(t, n)] = p
        write(designs, args.out)  # after every task, so a long run always leaves a usable table
    if pool is not None:
        pool.close()
        pool.join()
    ts, ns, rs = write(designs, args.out)
    print(f"wrote {len(ts)} designs to {args.out} in {time.time() - t_start:.0f}s")
    for t, n, r in zip(ts, ns, rs):
        print(f"  t={t:3d}  N={n:4d}  |r|={r:.2e}")


def write(designs, out):
    """Save designs with their independently re-measured residuals (sorted by t, then N)."""
    arrays = {}
    ts, ns, rs, qs = [], [], [], []
    for t, n in sorted(designs):
        p = designs[(t, n)]
        r = independent_residual(p, t)
        assert r < TOL, (t, n, r)
        arrays[f"t{t}_n{n}"] = p
        ts.append(t)
        ns.append(n)
        rs.append(r)
        qs.append(float(np.abs(np.linalg.norm(p, axis=1) - 1).max()))
    arrays["t"] = np.array(ts, dtype=np.int64)
    arrays["n"] = np.array(ns, dtype=np.int64)
    arrays["residual"] = np.array(rs, dtype=np.float64)
    arrays["max_norm_error"] = np.array(qs, dtype=np.float64)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, out)
    return ts, ns, rs


if __name__ == "__main__":
    main()

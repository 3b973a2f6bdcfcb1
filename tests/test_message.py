"""Message-passing layers (est.nn.edges/radial/so2/activations/attention/edge_embedding).

All checks run in float64 on small random molecules built with radius_graph.
Rotating positions by R and node features by D(R) must rotate the outputs by
D(R): exactly (round-off) for everything but the S2 grid activation, whose
error is aliasing and is asserted against a bound measured for the grid.
"""
import math

import pytest
import torch
from torch_geometric.data import Data

import est.geometry as graph
from est.geometry import radius_graph
from est.models import build_model
from est.nn.activations import GateActivation, S2GridActivation, SeparableS2Activation, SmoothLeakyReLU
from est.nn.attention import AttentionConfig, SO2GraphAttention, attention_num_parameters, segment_softmax
from est.nn.edge_embedding import EdgeDegreeEmbedding
from est.nn.edges import EdgeFrame, build_edge_frame, truncation_rescale
from est.nn.radial import GaussianRadialBasis, PolynomialEnvelope, RadialMLP
from est.nn.so2 import SO2Convolution
from est.so3 import m_major_index, num_coefficients, random_rotation, rotation_y, wigner_D

DT = torch.float64
L, M, C, NB, CUT = 3, 2, 6, 12, 4.0
EXACT = 1e-10


@pytest.fixture(autouse=True)
def _float64_single_thread(float64):
    """float64; one intra-op thread (tiny tensors: threads only add contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def molecule(n=9, seed=0, min_dist=0.9):
    """Random positions with pairwise distances >= min_dist, and elements 1..8."""
    g = torch.Generator().manual_seed(seed)
    pos = []
    while len(pos) < n:
        p = torch.randn(3, generator=g, dtype=DT) * 1.3
        if all(torch.linalg.vector_norm(p - q) >= min_dist for q in pos):
            pos.append(p)
    return torch.stack(pos), torch.randint(1, 9, (n,), generator=g)


def make_frame(pos, z, basis, lmax=L, mmax=M):
    g = radius_graph(pos, CUT)
    return build_edge_frame(
        g.edge_index, g.edge_vec, lmax=lmax, mmax=mmax, num_nodes=pos.shape[0], radial_basis=basis, atomic_numbers=z
    )


def basis(envelope="polynomial"):
    return GaussianRadialBasis(num_basis=NB, cutoff=CUT, envelope=envelope)


def attention(**kw):
    cfg = dict(
        lmax=L, mmax=M, channels=C, hidden_channels=5, num_heads=2, alpha_channels=4, value_channels=3,
        output_channels=4, edge_scalar_channels=NB, edge_channels=7, num_elements=10,
    )
    cfg.update(kw)
    return SO2GraphAttention(AttentionConfig(**cfg))


def rotated_error(layer_fn, lmax=L, seed=0, scale=1.0):
    """max |D(R) f(pos, x) - f(R pos, D(R) x)| and max |f| over 3 random rotations."""
    pos, z = molecule(seed=seed)
    x = scale * torch.randn(pos.shape[0], num_coefficients(lmax), C, dtype=DT)
    y = layer_fn(pos, z, x)
    err = 0.0
    for R in random_rotation(3, dtype=DT, generator=torch.Generator().manual_seed(seed + 1)):
        D = wigner_D(lmax, R[None])[0]
        y_rot = layer_fn(pos @ R.T, z, D @ x)
        err = max(err, (D @ y - y_rot).abs().max().item())
    return err, y.abs().max().item()


# --------------------------------------------------------------------------- radial
def test_gaussian_basis_matches_definition():
    b = GaussianRadialBasis(num_basis=5, cutoff=4.0, width_factor=2.0)
    r = torch.tensor([0.0, 1.3, 4.0])
    mu, sigma = torch.linspace(0, 4, 5), 2.0 * 1.0
    ref = torch.exp(-((r[:, None] - mu) ** 2) / (2 * sigma**2))
    assert torch.allclose(b(r), ref)
    assert b.envelope is None


def test_envelope_smooth_at_cutoff():
    env = PolynomialEnvelope(cutoff=2.0, exponent=5)
    r = torch.tensor([0.0, 2.0 - 1e-12, 2.0, 2.5], requires_grad=True)
    u = env(r)
    (g,) = torch.autograd.grad(u.sum(), r, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), r)
    assert u[0].item() == pytest.approx(1.0)
    assert u[1:].abs().max() < 1e-9 and g[1:].abs().max() < 1e-9 and h[1:].abs().max() < 1e-6


def test_radial_mlp_shape_and_count():
    mlp = RadialMLP(channels=[10, 7, 7, 3])
    assert mlp(torch.randn(4, 10)).shape == (4, 3)
    assert sum(p.numel() for p in mlp.parameters()) == 11 * 7 + 8 * 7 + 8 * 3 + 2 * 7 * 2


# --------------------------------------------------------------------------- frames
def test_frame_rotates_into_edge_axis():
    pos, z = molecule()
    f = make_frame(pos, z, basis())
    K = num_coefficients(L)
    src, tgt = f.edge_index
    from est.so3 import spherical_harmonics

    Y = spherical_harmonics(L, pos[src] - pos[tgt], normalize=True)  # [E, K]
    Y_edge = f.to_edge(Y[:, :, None])[:, :, 0]  # [E, K_M]
    pole = spherical_harmonics(L, torch.tensor([[0.0, 1.0, 0.0]]))[0][m_major_index(L, M)]
    assert torch.allclose(Y_edge, pole.expand_as(Y_edge), atol=1e-12)
    assert f.D_m.shape == (f.num_edges, K - 2 * sum(range(1, L - M + 1)), K)


def test_truncation_rescale_values():
    s = truncation_rescale(6, 2)
    idx = m_major_index(6, 2)
    l = torch.tensor([int(math.isqrt(int(k))) for k in idx])
    assert torch.allclose(s, torch.where(l > 2, torch.sqrt((2 * l + 1) / 5.0), torch.ones(len(l), dtype=DT)))


# --------------------------------------------------------------------------- SO(2) convolution
def test_so2_convolution_commutes_with_rotations_about_the_axis():
    E, Cin = 7, 3
    conv = SO2Convolution(lmax=L, mmax=M, in_channels=Cin, out_channels=4, radial_channels=[NB, 5], extra_m0_channels=2)
    idx = m_major_index(L, M)
    x = torch.randn(E, len(idx), Cin)
    s = torch.randn(E, NB)
    D = wigner_D(L, rotation_y(torch.rand(E) * 6.3))[:, idx][:, :, idx]  # [E, K_M, K_M] roll, m-major
    y, extra = conv(x, s)
    y_rot, extra_rot = conv(D @ x, s)
    assert (D @ y - y_rot).abs().max() < EXACT and (extra - extra_rot).abs().max() < EXACT
    assert y.shape == (E, len(idx), 4) and extra.shape == (E, 2)


def test_so2_convolution_without_radial_and_counts():
    conv = SO2Convolution(lmax=4, mmax=2, in_channels=3, out_channels=2)
    y, extra = conv(torch.randn(5, len(m_major_index(4, 2)), 3))
    assert extra is None and conv.radial is None and y.shape[-1] == 2
    n0, n1, n2 = 5, 4, 3
    expect = n0 * 3 * n0 * 2 + n0 * 2 + 2 * (n1**2 + n2**2) * 3 * 2
    assert sum(p.numel() for p in conv.parameters()) == expect


def test_so2_convolution_in_frame_is_equivariant():
    """rotate in -> SO(2) conv -> rotate back -> sum: exact SO(3) equivariance."""
    conv = SO2Convolution(lmax=L, mmax=M, in_channels=C, out_channels=C, radial_channels=[NB, 8])
    b = basis()

    def f(pos, z, x):
        fr = make_frame(pos, z, b)
        y, _ = conv(fr.to_edge(fr.gather_edges(x)[0]), fr.edge_scalars)
        return fr.scatter_targets(fr.to_global(y) * fr.envelope[:, None, None])

    err, size = rotated_error(f)
    assert err < EXACT * size, err


# --------------------------------------------------------------------------- activations
def test_smooth_leaky_relu():
    x = torch.linspace(-30, 30, 7)
    ref = 0.6 * x + 0.4 * x * (2 * torch.sigmoid(x) - 1)
    assert torch.allclose(SmoothLeakyReLU(0.2)(x), ref)


def test_grid_activation_matches_full_layout_on_truncated_input():
    """Slicing the transform with m_major_index == zero-padding to the full layout."""
    full = S2GridActivation(lmax=L, mmax=None, grid_resolution=(12, 12))
    trunc = S2GridActivation(lmax=L, mmax=M, grid_resolution=(12, 12), truncation_rescale=False)
    idx = m_major_index(L, M)
    x_m = torch.randn(4, len(idx), 3)
    x_full = torch.zeros(4, num_coefficients(L), 3).index_copy(1, idx, x_m)
    assert torch.allclose(trunc(x_m), full(x_full)[:, idx], atol=1e-12)


@pytest.mark.parametrize("normalization", ["component", "integral"])
def test_grid_activation_matches_e3nn_grids_with_truncation_rescale(normalization):
    """EquiformerV2's recipe with e3nn's public grids: zero-pad |m| <= M, scale degrees
    l > M by s_l, ToS2Grid (18 x 18), SiLU, FromS2Grid, scale by s_l again."""
    from e3nn.o3 import FromS2Grid, ToS2Grid

    lmax, mmax = 4, 2
    act = S2GridActivation(lmax=lmax, mmax=mmax, grid_resolution=(18, 18), grid_normalization=normalization)
    idx = m_major_index(lmax, mmax)
    x_m = 2 * torch.randn(3, len(idx), 5)
    s_full = torch.ones(num_coefficients(lmax)).index_copy(0, idx, truncation_rescale(lmax, mmax))
    x = torch.zeros(3, num_coefficients(lmax), 5).index_copy(1, idx, x_m) * s_full[:, None]  # [B, K, C]
    to_grid = ToS2Grid(lmax, (18, 18), normalization=normalization)
    from_grid = FromS2Grid((18, 18), lmax, normalization=normalization)
    f = to_grid(x.transpose(1, 2))  # [B, C, beta, alpha]
    ref = (from_grid(torch.nn.functional.silu(f)).transpose(1, 2) * s_full[:, None])[:, idx]
    assert torch.allclose(act(x_m), ref, atol=1e-12)


def test_separable_and_gate_shapes_and_l0():
    idx = m_major_index(L, M)
    x, g = torch.randn(4, len(idx), 3), torch.randn(4, 3)
    y = SeparableS2Activation(lmax=L, mmax=M)(g, x)
    assert torch.allclose(y[:, 0], torch.nn.functional.silu(g))
    gate = GateActivation(lmax=L, mmax=M, channels=3)
    y = gate(torch.zeros(4, L * 3), x)
    assert torch.allclose(y[:, 1:], 0.5 * x[:, 1:]) and torch.allclose(y[:, 0], torch.nn.functional.silu(x[:, 0]))


# --------------------------------------------------------------------------- attention
def test_attention_gate_is_exactly_equivariant():
    att = attention(use_gate_act=True).eval()
    b = basis()
    err, size = rotated_error(lambda p, z, x: att(x, make_frame(p, z, b)), scale=3.0)
    assert err < EXACT * max(size, 1), err


# measured max error / max output (L=3, M=2, inputs of scale 3, component grid):
# equiangular 18x18 ~4e-5, 40x40 ~1e-8, 80x80 ~1e-14: S2 aliasing falls spectrally with the grid.
@pytest.mark.parametrize("resolution,bound", [((18, 18), 5e-4), ((80, 80), 1e-11)])
def test_attention_separable_s2_equivariance_within_grid_bound(resolution, bound):
    att = attention(grid_resolution=resolution).eval()
    b = basis()
    err, size = rotated_error(lambda p, z, x: att(x, make_frame(p, z, b)), scale=3.0)
    assert err < bound * size, (resolution, err / size)


@pytest.mark.parametrize("kw", [dict(use_sep_s2_act=False), dict(use_s2_act_attn=True), dict(use_attn_renorm=False)])
def test_attention_variants_equivariant(kw):
    att = attention(grid_resolution=(80, 80), **kw).eval()
    b = basis()
    err, size = rotated_error(lambda p, z, x: att(x, make_frame(p, z, b)), scale=3.0)
    assert err < 1e-10 * size, (kw, err)


def test_attention_permutation_equivariant():
    att = attention(use_gate_act=True).eval()
    b = basis()
    pos, z = molecule()
    x = torch.randn(pos.shape[0], num_coefficients(L), C)
    perm = torch.randperm(pos.shape[0])
    y = att(x, make_frame(pos, z, b))
    y_p = att(x[perm], make_frame(pos[perm], z[perm], b))
    assert (y[perm] - y_p).abs().max() < EXACT


def test_attention_eval_deterministic_and_train_dropout():
    att = attention(alpha_drop=0.5)
    b = basis()
    pos, z = molecule()
    x = torch.randn(pos.shape[0], num_coefficients(L), C)
    f = make_frame(pos, z, b)
    att.eval()
    assert torch.equal(att(x, f), att(x, f))
    att.train()
    assert not torch.equal(att(x, f), att(x, f))


def test_gradients_reach_all_parameters_and_positions():
    att = attention()
    ede = EdgeDegreeEmbedding(
        lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, num_elements=10, avg_degree=4.0
    )
    b = basis()
    pos, z = molecule()
    pos.requires_grad_(True)
    f = make_frame(pos, z, b)
    x = ede(f) + torch.randn(pos.shape[0], num_coefficients(L), C)
    energy = att(x, f)[:, 0].pow(2).sum() + att(x, f)[:, 1:].pow(2).sum()
    energy.backward()
    assert pos.grad is not None and torch.isfinite(pos.grad).all() and pos.grad.abs().sum() > 0
    for name, p in [*att.named_parameters(), *ede.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_edges_along_pole_have_finite_gradients():
    """Edges exactly along +y and -y (the frame's pole and its antipode)."""
    pos = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.5, 0.0], [0.0, -1.5, 0.0], [1.2, 0.3, 0.4]], requires_grad=True)
    z = torch.tensor([1, 6, 8, 1])
    att = attention(use_gate_act=False)
    ede = EdgeDegreeEmbedding(
        lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, num_elements=10, avg_degree=3.0
    )
    f = make_frame(pos, z, basis())
    x = ede(f)
    e = att(x, f).pow(2).sum()
    (g,) = torch.autograd.grad(e, pos)
    assert torch.isfinite(g).all()


def test_position_gradient_matches_finite_differences():
    """d/dpos through the edge frames (Wigner-D keeps its graph), radial basis and envelope."""
    att = attention(use_gate_act=True).eval()
    ede = EdgeDegreeEmbedding(
        lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, num_elements=10, avg_degree=3.0
    )
    b = basis()
    pos, z = molecule(n=5, seed=3)

    def energy(p):
        f = make_frame(p, z, b)
        return att(ede(f) * 10, f).pow(2).sum()

    assert torch.autograd.gradcheck(energy, (pos.clone().requires_grad_(True),), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_output_continuous_when_an_edge_crosses_the_cutoff():
    """With the envelope the output changes by O(step) as an atom leaves the cutoff
    of atom 0; without it the attention weights and messages jump."""
    base = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.2, 0.1], [0.3, 1.1, -0.2]])
    z = torch.tensor([1, 6, 8, 1])
    x = torch.randn(4, num_coefficients(L), C)
    att = attention(use_gate_act=True).eval()

    def jump(envelope, eps):
        b = basis(envelope)
        pos = [torch.cat([base, torch.tensor([[d, 0.0, 0.0]])]) for d in (CUT - eps, CUT + eps)]
        out = [att(x, make_frame(p, z, b)) for p in pos]
        return (out[0] - out[1]).abs().max().item()

    assert jump("polynomial", 1e-7) < 1e-6 and jump("polynomial", 1e-8) < 1e-7
    assert jump(None, 1e-8) > 1e-4


def test_layers_without_edges():
    """Atoms beyond the cutoff of each other: E = 0, messages are empty (exact zeros), no crash."""
    pos = torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 20.0, 0.0]])
    z = torch.tensor([1, 6, 8])
    f = make_frame(pos, z, basis())
    assert f.num_edges == 0 and f.D_m.shape == (0, sum(m_major_index(L, M).shape), num_coefficients(L))
    conv = SO2Convolution(lmax=L, mmax=M, in_channels=3, out_channels=5, radial_channels=NB, extra_m0_channels=2)
    y, extra = conv(torch.zeros(0, f.D_m.shape[1], 3), f.edge_scalars)
    assert y.shape == (0, f.D_m.shape[1], 5) and extra.shape == (0, 2)
    att = attention().eval()
    out = att(torch.randn(3, num_coefficients(L), C), f)  # only the output projection's l = 0 bias remains
    assert torch.equal(out[:, 1:], torch.zeros_like(out[:, 1:]))
    assert torch.equal(out[:, 0], att.proj.bias.expand(3, -1))
    ede = EdgeDegreeEmbedding(lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, num_elements=10,
                              avg_degree=2.0)
    assert torch.equal(ede(f), torch.zeros(3, num_coefficients(L), C))


# --------------------------------------------------------------------------- chart switch of the edge frame
# edge_rotation uses a second chart for edges within ~26 deg of -y (u_y < _SWITCH = -0.9); the two charts
# differ by a roll about the edge. SO(2) convolutions are exactly roll-equivariant; the separable S2
# activation samples an equiangular grid with res_alpha longitudes, so a roll aliases orders m -> m +- res_alpha
# and the output can jump when a bond crosses the cone. We measure the jump as the difference between the two
# charts at the same geometry (moving the boundary across the bond), a tiny random float64 model, 5 atoms,
# one bond on the cone at 3 azimuths. "sharpness" s evaluates SiLU(s f)/s on the grid: the amplitudes a trained
# model feeds the activation (the aliasing grows like a power of the amplitude).
CONE_ATOMS = torch.tensor([[1.1, 0.2, -0.4], [-0.9, 0.5, 0.8], [0.3, -1.2, 1.0]])


def cone_molecule(phi, uy=-0.9):
    s = math.sqrt(1 - uy * uy)
    bond = 1.3 * torch.tensor([s * math.cos(phi), uy, s * math.sin(phi)])
    pos = torch.cat([torch.zeros(1, 3), bond[None], CONE_ATOMS])
    return Data(pos=pos, atomic_numbers=torch.tensor([6, 8, 1, 7, 1]))


def chart_gap(model, monkeypatch, uy=-0.9):
    """max over azimuths of |E(chart +) - E(chart -)| and max |F(+) - F(-)| at the same geometry."""
    dE = dF = 0.0
    for phi in (0.3, 1.9, 4.0):
        data = cone_molecule(phi, uy)
        outs = []
        for switch in (uy - 0.02, uy + 0.02):  # boundary below the bond: chart +; above it: chart -
            monkeypatch.setattr(graph, "_SWITCH", switch)
            outs.append(model(data))
        dE = max(dE, (outs[0]["energy"] - outs[1]["energy"]).abs().item())
        dF = max(dF, (outs[0]["forces"] - outs[1]["forces"]).abs().max().item())
    monkeypatch.undo()
    return dE, dF


def cone_model(resolution, sharpness=1.0, lmax=3):
    """eqv2-tiny (direct forces, envelope) with the given attention grid; seed 0."""
    torch.manual_seed(0)
    model = build_model("eqv2-tiny", grid_resolution=resolution, lmax=lmax, regress_forces="direct",
                        envelope="polynomial").eval()
    for mod in model.modules():
        if isinstance(mod, S2GridActivation) and sharpness != 1.0:
            mod.register_forward_pre_hook(lambda m, args: (args[0] * sharpness,))
            mod.register_forward_hook(lambda m, args, out: out / sharpness)
    return model


def test_the_two_charts_differ_by_a_roll_on_the_cone(monkeypatch):
    u = cone_molecule(0.3).pos[1:2] / 1.3  # [1, 3] the bond on the cone
    R = []
    for switch in (-0.92, -0.88):
        monkeypatch.setattr(graph, "_SWITCH", switch)
        R.append(graph.edge_rotation(u)[0])
    assert (R[0] - R[1]).abs().max() > 0.1  # the frames really differ (the test below is not vacuous)
    roll = R[0] @ R[1].T  # a rotation about the pole y
    assert (roll @ torch.tensor([0.0, 1.0, 0.0]) - torch.tensor([0.0, 1.0, 0.0])).abs().max() < 1e-14


@pytest.mark.parametrize(
    "resolution, sharpness, max_dE, max_dF",
    [
        ((10, 9), 1.0, 1e-14, 4e-11),  # measured dE 8.9e-16 (round-off), dF 3.4e-12 (|E| 7e-2, |F| 2e-2)
        ((10, 9), 10.0, 1.5e-11, 6e-9),  # measured dE 1.5e-12, dF 5.6e-10
        ((18, 18), 10.0, 1e-14, 1e-14),  # EquiformerV2's grid: measured dE 2.8e-17, dF 2.2e-17 (round-off)
    ],
)
def test_energy_jump_when_a_bond_crosses_the_chart_cone(resolution, sharpness, max_dE, max_dF, monkeypatch):
    dE, dF = chart_gap(cone_model(resolution, sharpness), monkeypatch)
    assert dE < max_dE and dF < max_dF, (dE, dF)
    if resolution == (10, 9) and sharpness > 1:
        assert dF > 1e-12  # the coarse grid does alias: the measurement sees the chart switch


def test_segment_softmax_normalised_and_weighted():
    logits = torch.randn(6, 2)
    index = torch.tensor([0, 0, 1, 1, 1, 3])
    a = segment_softmax(logits, index, 4)
    sums = torch.zeros(4, 2).index_add_(0, index, a)
    assert torch.allclose(sums[[0, 1, 3]], torch.ones(3, 2)) and (sums[2] == 0).all()
    w = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    aw = segment_softmax(logits, index, 4, w)
    assert aw[1].abs().max() == 0 and torch.allclose(aw[0], torch.ones(2))


def test_attention_parameter_formula():
    for kw in [dict(), dict(use_gate_act=True), dict(use_s2_act_attn=True), dict(use_atom_edge_embedding=False)]:
        att = attention(**kw)
        assert sum(p.numel() for p in att.parameters()) == attention_num_parameters(att.config), kw
    # EquiformerV2 OC20 S2EF-2M shape (L=6, M=2): the attention block counted from fairchem's code
    cfg = AttentionConfig(
        lmax=6, mmax=2, channels=128, hidden_channels=64, num_heads=8, alpha_channels=64, value_channels=16,
        output_channels=128, edge_scalar_channels=600, edge_channels=128, num_elements=90,
    )
    assert attention_num_parameters(cfg) == 6_096_256


# --------------------------------------------------------------------------- edge-degree embedding
def test_edge_degree_embedding_equivariant():
    ede = EdgeDegreeEmbedding(
        lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, num_elements=10, avg_degree=4.0
    )
    b = basis()
    err, size = rotated_error(lambda p, z, x: ede(make_frame(p, z, b)))
    assert err < EXACT * max(size, 1e-3), err
    assert size > 0


# --------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors():
    att = attention()
    b = basis()
    pos, z = molecule()
    f = make_frame(pos, z, b)
    K = num_coefficients(L)
    with pytest.raises(ValueError, match="K=16"):
        att(torch.randn(pos.shape[0], K + 1, C), f)
    with pytest.raises(ValueError, match="lmax=2"):
        att(torch.randn(pos.shape[0], K, C), make_frame(pos, z, b, lmax=2, mmax=2))
    with pytest.raises(ValueError, match="K_M="):
        SO2Convolution(lmax=L, mmax=M, in_channels=3, out_channels=3)(torch.randn(4, K, 3))
    with pytest.raises(ValueError, match="atomic_numbers"):
        att(torch.randn(pos.shape[0], K, C), f._replace(atomic_numbers=torch.full_like(z, 10)))
    with pytest.raises(ValueError, match="atomic numbers"):
        att(torch.randn(pos.shape[0], K, C), f._replace(atomic_numbers=None))
    with pytest.raises(ValueError, match="avg_degree"):
        EdgeDegreeEmbedding(lmax=L, mmax=M, channels=C, edge_scalar_channels=NB, edge_channels=7, avg_degree=0.0)
    with pytest.raises(ValueError, match="mmax"):
        AttentionConfig(lmax=2, mmax=3, channels=1, hidden_channels=1, num_heads=1, alpha_channels=1,
                        value_channels=1, output_channels=1, edge_scalar_channels=1, edge_channels=1)
    with pytest.raises(TypeError, match=r"torch.float32 but the weights are torch.float64.*module.float\(\)"):
        att(torch.randn(pos.shape[0], K, C, dtype=torch.float32), f)
    with pytest.raises(ValueError, match="exactly one"):
        build_edge_frame(f.edge_index, torch.randn(f.num_edges, 3), lmax=L, mmax=M, num_nodes=pos.shape[0])
    assert isinstance(f, EdgeFrame)


if __name__ == "__main__":  # PYTHONPATH=. python tests/test_message.py: the chart-switch jumps at each grid
    torch.set_default_dtype(DT)
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    for res, lmax in [((10, 9), 3), ((12, 11), 3), ((18, 18), 3), ((14, 13), 6), ((18, 18), 6)]:
        for s in (1.0, 3.0, 10.0, 30.0):
            model = cone_model(res, s, lmax)
            dE, dF = chart_gap(model, mp)
            data = cone_molecule(0.3, uy=-0.5)  # for scale: the energy's rotation error, same model
            e = model(data)["energy"]
            rot = max((model(Data(pos=data.pos @ R.T, atomic_numbers=data.atomic_numbers))["energy"] - e).abs().item()
                      for R in random_rotation(3, generator=torch.Generator().manual_seed(1)))
            print(f"grid {res[0]}x{res[1]} L={lmax} sharpness {s:4.0f}: |dE| = {dE:.1e}  max|dF| = {dF:.1e}  "
                  f"(|E| = {e.abs().item():.1e}, rotation error of E = {rot:.1e})")

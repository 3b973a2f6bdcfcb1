"""Normalisers and per-element linear references (fitted, saved with the model)."""
import torch

from est.data import LinearReference, Normalizer, fit_linear_reference, fit_normalizer, make_sample, collect_targets


def test_normalizer_round_trip_and_state_dict():
    x = torch.randn(100, 2, dtype=torch.float64) * 3 + 5
    n = fit_normalizer(x)
    y = n.norm(x)
    assert torch.allclose(y.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(n.denorm(y), x)
    m = Normalizer()
    m.load_state_dict(n.state_dict())
    assert torch.equal(m.mean, n.mean) and torch.equal(m.std, n.std)


def test_linear_reference_recovers_element_energies():
    g = torch.Generator().manual_seed(0)
    true = torch.zeros(101, dtype=torch.float64)
    true[[1, 6, 7, 8]] = torch.tensor([-13.6, -1029.9, -1485.3, -2042.6], dtype=torch.float64)
    data = []
    for _ in range(60):
        z = torch.tensor([1, 6, 7, 8])[torch.randint(0, 4, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g)]
        e = true[z].sum() + 0.01 * torch.randn(1, generator=g, dtype=torch.float64)
        data.append(make_sample(pos=torch.zeros(len(z), 3), atomic_numbers=z, energy=e))
    y, zs = collect_targets(data, "energy")
    ref = fit_linear_reference(y, zs)
    assert torch.allclose(ref.weight[[1, 6, 7, 8], 0], true[[1, 6, 7, 8]], atol=0.05)
    assert ref.weight[2, 0] == 0  # unseen element
    from torch_geometric.data import Batch

    b = Batch.from_data_list(data[:5])
    out = ref(b.atomic_numbers, b.batch, b.num_graphs)
    assert out.shape == (5,) and torch.allclose(out.float(), b.energy, atol=0.2)
    other = LinearReference()
    other.load_state_dict(ref.state_dict())
    assert torch.equal(other.weight, ref.weight)


def test_dataset_statistics_molecules():
    from est.data import dataset_statistics

    # a linear H chain with 1 A spacing: with cutoff 1.5 each inner atom has 2 neighbours
    data = [make_sample(pos=torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [2.0, 0, 0]]), atomic_numbers=torch.ones(3, dtype=torch.long),
                        energy=e) for e in (1.0, 3.0)]
    st = dataset_statistics(data, cutoff=1.5)
    assert st["avg_num_nodes"] == 3 and st["max_num_nodes"] == 3
    assert abs(st["avg_degree"] - 4 / 3) < 1e-9
    assert st["energy_mean"] == 2.0 and st["energy_std"] == 1.0


def test_fits_leave_out_nonfinite_targets():
    import pytest

    x = torch.tensor([[1.0, 2.0], [3.0, float("nan")], [5.0, 6.0], [float("inf"), 0.0]], dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"fit_normalizer: 2 of 4 targets are NaN/inf \(rows \[1, 3\]"):
        n = fit_normalizer(x)
    assert torch.equal(n.mean, torch.tensor([3.0, 4.0], dtype=torch.float64))  # rows 0 and 2 only
    zs = [torch.tensor([1, 1]), torch.tensor([1]), torch.tensor([1, 1, 1])]
    with pytest.warns(UserWarning, match="fit_linear_reference: 1 of 3"):
        ref = fit_linear_reference(torch.tensor([-2.0, float("nan"), -3.0], dtype=torch.float64), zs)
    assert torch.allclose(ref.weight[1, 0], torch.tensor(-1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="no finite targets"):
        fit_normalizer(torch.full((3,), float("nan")))

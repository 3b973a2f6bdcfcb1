"""Training-side options that separate est's EquiformerV2 from fairchem's:
EquiformerV2's weight initialisation and the random roll of edge frames."""
import math

import pytest
import torch
from torch import nn
from torch_geometric.data import Batch, Data

from est.models import EquiformerV2, model_config
from est.models.init import init_weights_
from est.nn import DegreeLinear
from est.nn.radial import RadialMLP

torch.set_num_threads(1)


def _molecule():
    g = torch.Generator().manual_seed(3)
    pos = torch.randn(7, 3, generator=g, dtype=torch.float64) * 1.2
    return Batch.from_data_list([Data(pos=pos, atomic_numbers=torch.tensor([6, 6, 8, 1, 1, 1, 1]),
                                      natoms=torch.tensor([7]))])


def test_eqv2_normal_init_matches_fairchems_normal_statistics():
    torch.manual_seed(0)
    model = EquiformerV2(model_config("eqv2-small", weight_init="eqv2-normal"))
    radial = {id(m) for r in model.modules() if isinstance(r, RadialMLP) for m in r.modules()}
    checked = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, DegreeLinear)):
            fan_in = m.in_features if isinstance(m, nn.Linear) else m.in_channels
            if m.bias is not None:
                assert torch.count_nonzero(m.bias) == 0
            if id(m) in radial:  # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) kept
                assert float(m.weight.abs().max()) <= 1 / math.sqrt(fan_in)
            elif m.weight.numel() >= 2000:  # N(0, 1/fan_in); enough samples for a 10% std check
                assert float(m.weight.std()) == pytest.approx(1 / math.sqrt(fan_in), rel=0.1), m
                checked += 1
    assert checked > 10


def test_eqv2_init_differs_from_torch_only_in_the_biases():
    torch.manual_seed(0)
    a = EquiformerV2(model_config("eqv2-tiny", weight_init="torch"))
    torch.manual_seed(0)
    b = EquiformerV2(model_config("eqv2-tiny", weight_init="eqv2"))
    torch.manual_seed(0)
    c = EquiformerV2(model_config("eqv2-tiny"))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))  # "torch" is the default
    differ = [n for (n, p), q in zip(a.named_parameters(), b.parameters()) if not torch.equal(p, q)]
    assert differ and all(n.endswith("bias") for n in differ)
    with pytest.raises(ValueError, match="weight_init must be one of"):
        init_weights_(a, "xavier")
    with pytest.raises(ValueError, match="weight_init must be 'eqv2', 'eqv2-normal' or 'torch'"):
        model_config("eqv2-tiny", weight_init="xavier")


def test_edge_roll_is_training_only_and_changes_outputs_by_aliasing_only():
    torch.manual_seed(0)
    kw = dict(regress_forces="gradient", envelope="polynomial", max_neighbors=None)
    rolled = EquiformerV2(model_config("eqv2-tiny", edge_roll=True, **kw)).double()
    plain = EquiformerV2(model_config("eqv2-tiny", **kw)).double()
    plain.load_state_dict(rolled.state_dict())
    b = _molecule()
    rolled.eval(), plain.eval()
    e_eval = rolled(b)["energy"]
    assert torch.equal(e_eval, plain(b)["energy"])  # eval never rolls
    rolled.train(), plain.train()
    e_plain = plain(b)["energy"].detach()
    errs = [float(((rolled(b)["energy"].detach() - e_plain) / e_plain).abs()) for _ in range(3)]
    # measured on the tiny shape's 10x9 grid: 0.8e-13 .. 2.8e-13 relative (grid aliasing of the roll)
    assert max(errs) < 3e-12
    assert max(errs) > 0  # the roll does happen in training
    assert len(set(errs)) > 1  # and is redrawn at every call

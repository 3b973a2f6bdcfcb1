"""The README's ESTBlock example runs as written and the layer it builds is equivariant."""
import re
from pathlib import Path

import torch

from est.testing import check_model  # noqa: F401  (the README imports it too)

README = Path(__file__).resolve().parents[1] / "README.md"


def _example_namespace():
    code = re.search(r"## ESTBlock in your own model\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    return ns


def test_readme_estblock_example_runs_and_is_equivariant():
    ns = _example_namespace()
    torch.manual_seed(0)
    layer = ns["MyLayer"]().double().eval()
    L, C = ns["L"], ns["C"]
    N = 6
    pos = torch.randn(N, 3, dtype=torch.float64)
    x = torch.zeros(N, (L + 1) ** 2, C, dtype=torch.float64)
    x[:, 0] = torch.randn(N, C, dtype=torch.float64)
    src, dst = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    keep = src != dst
    edge_index = torch.stack([src[keep], dst[keep]])
    batch = torch.zeros(N, dtype=torch.long)
    out = layer(x, pos, edge_index, batch)
    assert out.shape == (N, (L + 1) ** 2, C)
    from est.so3 import random_rotation, wigner_D

    R = random_rotation(1)[0]
    D = wigner_D(L, R[None])[0]
    rot = layer(D @ x, pos @ R.T, edge_index, batch)
    # the default EST grid samples a t-design of degree 3L: aliasing. Measured (relative L2, 5 inits x 10
    # rotations): <= 1.6e-3; the tolerance is ~10x that
    assert float((rot - D @ out).norm() / out.norm()) < 1.5e-2

"""Installable package for est: the Equivariant Spherical Transformer for molecules."""
from setuptools import find_packages, setup

setup(
    name="est",
    version="0.1.0",
    description="Equivariant Spherical Transformer (EST) layers and EquiformerV2-style backbones",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # dataclass(kw_only=True) and PEP 604 unions at runtime need Python 3.10
    python_requires=">=3.10",
    packages=find_packages(include=["est", "est.*"]),
    package_data={"est.sphere": ["data/*.npz"], "est.data": ["assets/*"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.2",
        "e3nn>=0.5",
        "torch-geometric>=2.4",
        "numpy",
        "lmdb",
        "hydra-core>=1.3",
        "ase>=3.22",
    ],
    extras_require={
        # all 130,831 QM9 molecules as CSV, read offline from the installed wheel
        "qm9": ["qm9pack"],
        # GFN2-xTB energies and forces for the molecular MD set (python -m est.data.xtb)
        "xtb": ["tblite"],
        # tests, design generation (scipy), plots, executing the notebooks in tests,
        # tensorboard (the test reads the trainer's event file back), tblite (the xTB generator's tests)
        # and the two optional integrations below, so CI tests them
        "dev": ["pytest>=7", "scipy", "matplotlib", "nbformat", "nbclient", "ipykernel", "tensorboard", "tblite",
                "ase-db-backends", "torch-sim-atomistic>=0.3; python_version >= '3.11'"],
        # the trainer's optional tb/ event files (est.train.logs.TensorBoard is a no-op without it)
        "tensorboard": ["tensorboard"],
        # writing fairchem 2.x .aselmdb files (ASE's LMDB backend); reading needs only lmdb + ase
        "aselmdb": ["ase-db-backends"],
        # est.calculators.torch_sim.ESTTorchSimModel (torch-sim needs Python >= 3.11; 0.3.x there)
        "torchsim": ["torch-sim-atomistic>=0.3; python_version >= '3.11'"],
    },
)

"""python -m est.testing.check: argument parsing, loading protocol, exit codes, JSON."""
import json
import sys
import types

import pytest
import torch

from est.testing import check
from est.testing._reps import single_thread

pytestmark = pytest.mark.equivariance
FACTORY = "est.testing.toy_models:morse_potential"


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def test_factory_passes_and_prints_the_table(capsys, tmp_path):
    out = tmp_path / "report.json"
    rc = check.main(["--factory", FACTORY, "--set", "cutoff=3.0", "--sample", "molecule", "--sample", "crystal",
                     "--rotations", "2", "--refine", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "cell_rotation" in text and "supercell_2x1x1" in text and "all checks passed" in text
    data = json.loads(out.read_text())
    assert len(data) == 2 and all(d["ok"] for d in data)


def test_planted_defect_gives_exit_status_1(capsys):
    rc = check.main(["--factory", FACTORY, "--set", "defect='absolute_position'", "--sample", "molecule", "--rotations", "2", "--refine", "0"])
    assert rc == 1
    assert "SOME CHECKS FAILED" in capsys.readouterr().out


def test_user_factory_and_dtype_cast(capsys, monkeypatch):
    mod = types.ModuleType("my_models_for_cli")

    def make(scale=1.0):
        from est.testing.toy_models import MorsePotential

        return MorsePotential(cutoff=3.0 * scale)  # float32: --dtype float64 casts it

    mod.make = make
    monkeypatch.setitem(sys.modules, "my_models_for_cli", mod)
    rc = check.main(["--factory", "my_models_for_cli:make", "--set", "scale=1.0", "--dtype", "float64", "--sample", "molecule", "--refine", "0"])
    assert rc == 0 and "(float64)" in capsys.readouterr().out


def test_missing_backbone_or_trainer_fail_with_a_clear_message(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "est.models", types.ModuleType("est.models"))  # no build_model
    assert check.main(["--config", "est-tiny"]) == 2
    err = capsys.readouterr().err
    assert "est.models.build_model" in err and "Use --factory module:function" in err
    assert check.main(["--checkpoint", "/nonexistent/ckpt.pt"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_load_model_for_check_protocol(monkeypatch, tmp_path):
    with pytest.raises(check.ModelLoadError, match="exactly one"):
        check.load_model_for_check(config="a", factory="b:c")
    with pytest.raises(check.ModelLoadError, match="module:function"):
        check.load_model_for_check(factory="nocolon")
    fake = types.ModuleType("est.models")
    fake.build_model = lambda name, **kw: ("built", name, kw)
    monkeypatch.setitem(sys.modules, "est.models", fake)
    assert check.load_model_for_check(config="est-tiny", overrides={"lmax": 2}) == ("built", "est-tiny", {"lmax": 2})
    assert check._parse_overrides(["a=1", "b='x'", "c=foo", "d=[1, 2]"]) == {"a": 1, "b": "x", "c": "foo", "d": [1, 2]}


def test_checkpoint_in_est_train_format(tmp_path, capsys):
    from est.testing.toy_models import MorsePotential
    from est.train.checkpoint import save_checkpoint

    model = MorsePotential(cutoff=3.0)
    path = str(tmp_path / "last.pt")
    save_checkpoint({"config": {"model": {"_target_": "est.testing.toy_models.MorsePotential", "cutoff": 3.0}},
                     "model": model.state_dict(), "ema": None}, path)
    loaded = check.load_model_for_check(checkpoint=path, dtype=torch.float64)
    assert isinstance(loaded, MorsePotential) and loaded.a.dtype == torch.float64
    assert check.main(["--checkpoint", path, "--sample", "molecule", "--refine", "0"]) == 0


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as err:
        check.main([])
    assert err.value.code == 2
    for argv in (["--factory", FACTORY, "--rotatons", "2"], ["--factory", FACTORY, "--dtype", "float16"]):
        with pytest.raises(SystemExit) as err:  # argparse: unknown option, bad choice
            check.main(argv)
        assert err.value.code == 2


@pytest.mark.parametrize("argv, message", [
    (["--config", "est-tni"], "--config: ValueError: unknown model 'est-tni'; known: "),
    (["--config", "est-tiny", "--set", "lmx=3"], "unknown model config keys ['lmx']"),
    (["--factory", FACTORY, "--set", "cutof=3.0"], "--factory: TypeError:"),
    (["--factory", FACTORY, "--sample", "molecul"], "neither a built-in"),
])
def test_typos_in_names_and_options_exit_2_with_the_problem_named(argv, message, capsys):
    assert check.main(argv) == 2  # 1 is reserved for "a check failed"
    err = capsys.readouterr().err
    assert message in err and "usage: python -m est.testing.check" in err


def test_unreadable_sample_file_and_a_crashing_model(tmp_path, capsys, monkeypatch):
    garbage = tmp_path / "structure.xyz"
    garbage.write_bytes(b"\x00\x01 not a structure")
    assert check.main(["--factory", FACTORY, "--sample", str(garbage)]) == 2
    assert "cannot read sample file" in capsys.readouterr().err
    mod = types.ModuleType("crashing_models_for_cli")

    def make():
        def fn(positions, numbers, cell, pbc):
            raise RuntimeError("boom")

        return fn

    mod.make = make
    monkeypatch.setitem(sys.modules, "crashing_models_for_cli", mod)
    assert check.main(["--factory", "crashing_models_for_cli:make", "--sample", "molecule"]) == 3
    assert "the model raised RuntimeError on sample 'molecule': boom" in capsys.readouterr().err


def test_dtype_model_checks_in_the_models_own_dtype(capsys, monkeypatch):
    from est.testing.toy_models import MorsePotential

    mod = types.ModuleType("float32_models_for_cli")
    mod.make = lambda: MorsePotential(cutoff=3.0)  # float32
    monkeypatch.setitem(sys.modules, "float32_models_for_cli", mod)
    argv = ["--factory", "float32_models_for_cli:make", "--sample", "molecule", "--refine", "0"]
    assert check.main(argv + ["--dtype", "model"]) == 0
    assert "(float32)" in capsys.readouterr().out
    assert check.main(argv) == 0
    assert "(float64)" in capsys.readouterr().out  # the default

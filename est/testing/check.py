"""``python -m est.testing.check``: the equivariance report of a checkpoint, a config or a factory.

Examples::

    python -m est.testing.check --checkpoint runs/oc20/last.pt
    python -m est.testing.check --config est-small --set lmax=4 --dtype float32
    python -m est.testing.check --factory est.testing.toy_models:morse_potential --sample molecule --sample crystal

Model loading protocol (:func:`load_model_for_check`), imported lazily so this
module works before the backbone and the trainer exist:

* ``--config NAME``: ``est.models.build_model(name=NAME, **overrides)``;
* ``--checkpoint PATH``: ``est.train.load_trained_model(PATH, map_location=device)``
  if est.train provides it (returning the model or a dict with ``"model"``), else
  est.train's checkpoint format: ``est.train.checkpoint.load_checkpoint`` gives
  ``{"config", "model", "ema"}``, the model is ``est.train.loading.build_model_from_config(config)``
  with the EMA weights (``--no-ema``: the raw ones);
* ``--factory module:function``: ``function(**overrides)``, any importable callable
  returning an est model or a ``(positions, numbers, cell, pbc) -> dict`` callable.

``--set key=value`` overrides are parsed as Python literals where possible.
Checks run in float64 by default (a cast copy of the model); ``--dtype model``
checks the model in its own dtype.

Exit status: 0 all checks pass; 1 some check fails (and only then); 2 usage or
loading error (unknown option, config name, override key, sample, checkpoint),
with the message on stderr; 3 the model raised an error while being checked.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
import traceback
from typing import Any, Sequence

import torch

__all__ = ["load_model_for_check", "ModelLoadError", "builtin_sample", "main", "BUILTIN_SAMPLES", "build_parser"]

BUILTIN_SAMPLES = ("molecule", "crystal", "slab")


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says why and what to do."""


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ModelLoadError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def load_model_for_check(
    *,
    checkpoint: str | None = None,
    config: str | None = None,
    factory: str | None = None,
    overrides: dict[str, Any] | None = None,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    use_ema: bool = True,
):
    """Load the model to check: exactly one of ``checkpoint``, ``config``, ``factory`` (see the module docstring).

    Raises:
        ModelLoadError: the source is missing or est.models / est.train do not provide the entry point yet.
    """
    given = [k for k, v in (("checkpoint", checkpoint), ("config", config), ("factory", factory)) if v]
    if len(given) != 1:
        raise ModelLoadError(f"give exactly one of --checkpoint, --config, --factory (got {given or 'none'})")
    overrides = dict(overrides or {})
    if factory:
        if ":" not in factory:
            raise ModelLoadError(f"--factory must be 'module:function', got {factory!r}")
        mod_name, fn_name = factory.split(":", 1)
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as err:
            raise ModelLoadError(f"cannot import factory {factory!r}: {err}") from err
        model = fn(**overrides)
    elif config:
        try:
            from est.models import build_model  # lazy: the backbone may not exist yet
        except ImportError as err:
            raise ModelLoadError(
                "est.models.build_model(name=..., **kw) is not available in this checkout "
                f"({err}); the backbone is not installed yet. Use --factory module:function to check your own model"
            ) from err
        model = build_model(name=config, **overrides)
    else:
        if not os.path.exists(checkpoint):
            raise ModelLoadError(f"checkpoint {checkpoint!r} does not exist")
        model = _load_checkpoint(checkpoint, device=device, use_ema=use_ema)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
    return model


def _load_checkpoint(path: str, *, device: str, use_ema: bool):
    """:func:`est.train.load_trained_model` with its errors as :class:`ModelLoadError`."""
    from est.train.loading import load_trained_model

    try:
        return load_trained_model(path, map_location=device, use_ema=use_ema)[0]
    except (OSError, RuntimeError, ValueError) as err:
        raise ModelLoadError(str(err)) from err


def builtin_sample(name: str):
    """A built-in structure: ``molecule`` (8 atoms), ``crystal`` (4-atom triclinic cell), ``slab`` (pbc x, y)."""
    from .toy_models import example_crystal, example_molecule

    if name == "molecule":
        return example_molecule(8)
    if name == "crystal":
        return example_crystal()
    if name == "slab":
        return example_crystal(pbc=(True, True, False))
    raise ValueError(f"unknown built-in sample {name!r}; expected one of {BUILTIN_SAMPLES} or a structure file")


def _load_sample(spec: str):
    if spec in BUILTIN_SAMPLES:
        return builtin_sample(spec)
    if not os.path.exists(spec):
        raise ModelLoadError(f"sample {spec!r} is neither a built-in ({', '.join(BUILTIN_SAMPLES)}) nor an existing file")
    import ase.io

    try:
        return ase.io.read(spec)
    except Exception as err:  # noqa: BLE001 - ase raises many kinds for unreadable files
        raise ModelLoadError(f"cannot read sample file {spec!r} with ase.io.read: {type(err).__name__}: {err}") from err


PROG = "python -m est.testing.check"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MODEL_ERROR = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0],
        epilog="exit status: 0 all checks pass, 1 some check fails, 2 usage or loading error, 3 the model raised",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint path (est.train.load_model_from_checkpoint)")
    src.add_argument("--config", help="model config name (est.models.build_model(name=...))")
    src.add_argument("--factory", help="module:function returning a model")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="keyword arguments for the factory / build_model")
    p.add_argument("--sample", action="append", default=None, help=f"{', '.join(BUILTIN_SAMPLES)} or a structure file (ase.io.read); repeatable (default: molecule and crystal)")
    p.add_argument("--dtype", choices=("float64", "float32", "model"), default="float64",
                   help="dtype of the check: a cast copy of the model (default float64; 'model': its own dtype)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-ema", dest="use_ema", action="store_false", help="checkpoint: load the raw weights, not the EMA ones")
    p.add_argument("--tol", type=float, default=None, help="relative tolerance (default: 1e-10 float64, 1e-4 float32)")
    p.add_argument("--parity", action="store_true", help="assert reflections too (O(3) models)")
    p.add_argument("--rotations", type=int, default=8, help="random rotations before the local search")
    p.add_argument("--refine", type=int, default=12, help="local-search evaluations around the worst rotation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the reports as JSON")
    return p


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """argparse-style: usage line and ``error: message`` on stderr; exit status 2."""
    print(parser.format_usage().rstrip(), file=sys.stderr)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    from ._models import check_model

    parser = build_parser()
    args = parser.parse_args(argv)  # unknown or malformed options: SystemExit(2)
    dtype = "model" if args.dtype == "model" else getattr(torch, args.dtype)
    try:
        overrides = _parse_overrides(args.set)
        model = load_model_for_check(
            checkpoint=args.checkpoint, config=args.config, factory=args.factory,
            overrides=overrides, device=args.device, use_ema=args.use_ema,
        )
        samples = [(s, _load_sample(s)) for s in (args.sample or ["molecule", "crystal"])]
    except ModelLoadError as err:
        return _usage_error(parser, str(err))
    except (ValueError, TypeError, KeyError) as err:  # an unknown config name or override key, a bad factory argument
        source = "--config" if args.config else "--factory" if args.factory else "--checkpoint"
        return _usage_error(parser, f"{source}: {type(err).__name__}: {err}")
    reports = []
    for label, sample in samples:
        name = f"{args.checkpoint or args.config or args.factory} [{label}]"
        try:
            report = check_model(
                model, sample, tol=args.tol, parity=args.parity, num_rotations=args.rotations,
                refine_steps=args.refine, seed=args.seed, dtype=dtype, name=name,
            )
        except ValueError as err:  # a sample the checker cannot use (periodic without a cell, ...)
            return _usage_error(parser, f"sample {label!r}: {err}")
        except Exception as err:  # noqa: BLE001 - the model itself raised: not a failed check
            traceback.print_exc()
            print(f"{PROG}: error: the model raised {type(err).__name__} on sample {label!r}: {err}", file=sys.stderr)
            return EXIT_MODEL_ERROR
        reports.append(report)
        print(report.table())
        print()
    ok = all(r.ok for r in reports)
    print("est.testing.check: " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([json.loads(r.to_json()) for r in reports], f, indent=1)
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

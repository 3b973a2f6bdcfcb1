"""The training loop: one process, one GPU or many (torchrun / DDP).

>>> cfg = load_config(["+experiment=qm9_quick", "trainer.max_steps=100"])
>>> Trainer(cfg).fit()

Per optimiser step (all ranks in lock step):

1. counts of the global batch (graphs, free atoms) and the stop flag
   (SIGTERM/SIGINT) are all-reduced;
2. forward under bf16 autocast on GPU (fp32 on CPU), loss scaled by
   ``world / global count`` (so DDP's gradient averaging gives the loss of the
   global batch, whatever each rank's share of atoms);
3. a non-finite loss on any rank (all-reduced) or a non-finite gradient norm
   skips the update on every rank; more than ``trainer.max_bad_batches`` of
   them stop the run naming the step and the batch ids (weights untouched);
4. backward, gradient clipping, AdamW, LambdaLR, EMA update.

Before step 1, a batch whose float inputs (positions, cells, targets, any
other float field) are not finite is skipped the same way, on every rank,
naming the fields, ``sid``/``idx`` and the file (and key) of each bad sample.

Evaluation uses the EMA weights; metrics are all-reduced sums over counts.
``last.pt`` is written at every evaluation, every ``save_every`` steps, on
SIGTERM/SIGINT and at the end; ``best.pt`` when the monitored metric improves.
A run with ``trainer.resume=auto`` continues from ``run_dir/last.pt``
exactly: same sampler position, RNG states, optimiser, scheduler and EMA.

A run is *finished* only when ``final_metrics.json`` (written last, after the
final evaluation's CSV rows and plots, atomically) names its final step.
Rerunning a run that was killed after its last step (e.g. during the final
evaluation) completes what is missing: the last evaluation, ``best.pt`` (a
kill between writing ``last.pt`` and ``best.pt`` at an improving evaluation
is repaired by copying ``last.pt``, which holds the same state) and the final
results. Every checkpoint records the training elements (``elements``, with
``elements_source``), which the ASE calculator uses to refuse unseen ones.

The trainer's helpers, one job each: :mod:`~est.train.run_dir` (the run's
folder: writable, resume source, finished, ``best.pt`` repair),
:mod:`~est.train.signals` (SIGTERM/SIGINT), :mod:`~est.train.nonfinite`
(non-finite batches and their messages), :mod:`~est.train.report` (the
end-of-run report); ``mode=eval`` is :mod:`~est.train.eval_mode`.
"""
from __future__ import annotations

import contextlib
import os
import random
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from .checkpoint import FORMAT_VERSION, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import ConfigError, TrainConfig, to_container, validate_numbers
from ..models.config import MODEL_DEFAULTS_VERSION
from .loading import (build_model_from_config, checkpoint_model_config, load_trained_model,  # noqa: F401
                      model_dict, model_state)
from .data import Prefetcher, build_datasets, dataset_natoms, make_loader, resolve_model_stats, training_elements
from .distributed import DistInfo, all_gather_object, all_reduce_sum, barrier, broadcast_object, setup_distributed
from .ema import EMA
from .epoch_time import EpochTimer
from .eval_mode import evaluate_checkpoint  # noqa: F401  (mode=eval; re-exported where it used to live)
from .evaluation import evaluate
from .logs import MetricsCSV, TensorBoard
from .malloc import keep_freed_memory
from .nonfinite import NonFiniteLossError, bad_batch_message, batch_ids, nonfinite_inputs
from .optim import CosineWarmup, build_optimizer
from .report import write_final_report
from .run_dir import check_run_dir, check_same_model, final_results_written, repair_best, resume_checkpoint
from .sampler import GlobalBatchSampler
from .signals import StopSignals
from .tasks import Task, build_task

__all__ = ["Trainer", "NonFiniteLossError", "build_model_from_config", "evaluate_checkpoint", "check_run_dir"]


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class Trainer:
    """See module docstring.

    Args:
        cfg: the composed config (:func:`~est.train.config.load_config`).
        datasets: optional ``{"train": ..., "val": ..., "test": ...}`` of
            canonical samples, replacing the datasets the config describes.
        info: distributed info (default: from the environment, torchrun's).
    """

    def __init__(self, cfg: DictConfig, *, datasets: Optional[Dict[str, Any]] = None, info: Optional[DistInfo] = None):
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
        self.cfg = cfg
        t, d = cfg.trainer, cfg.data
        self.info = info or setup_distributed(t.device)
        self.device = self.info.device
        self.run_dir = os.path.abspath(cfg.run_dir)
        self.log = (lambda *a, **k: print(*a, **k, flush=True)) if self.info.is_main else (lambda *a, **k: None)
        if t.keep_freed_memory and self.device.type == "cpu" and not keep_freed_memory():
            self.log("[est.train] trainer.keep_freed_memory: the C library is not glibc; CPU allocations unchanged")
        validate_numbers(cfg)  # NaN / negative lr, batch sizes, ... before anything is read
        problem = broadcast_object(check_run_dir(self.run_dir) if self.info.is_main else None, self.info)
        if problem:  # checked before loading any data
            raise ConfigError(problem)
        self.task: Task = build_task(d, t)
        self.monitor = t.monitor or self.task.primary_metric
        if self.monitor not in self.task.metric_names():
            raise ConfigError(f"trainer.monitor={self.monitor!r} is not a metric of data.task={d.task}. "
                              f"Fix: choose one of {', '.join(self.task.metric_names())}.")

        # ---------------------------------------------------------------- resume?
        ckpt, self.resumed_from = resume_checkpoint(self.run_dir, t.resume)

        # ---------------------------------------------------------------- data
        self.datasets = datasets if datasets is not None else build_datasets(d, self.info)
        if "train" not in self.datasets:
            raise ConfigError("no training data. Fix: set data.train_path (OC20) or a QM9 source.")
        self.train_ds = self.datasets["train"]
        if len(self.train_ds) == 0:
            raise ConfigError("the training set is empty. Fix: check data paths and data.subset.")
        if d.batch_size > len(self.train_ds):
            raise ConfigError(f"data.batch_size={d.batch_size} (the global batch) is larger than the training set "
                              f"({len(self.train_ds)} samples): every epoch would be one partial batch. "
                              f"Fix: data.batch_size<={len(self.train_ds)}, or more training data (data.subset).")
        self.sampler = GlobalBatchSampler(
            len(self.train_ds), global_batch_size=d.batch_size, rank=self.info.rank, world_size=self.info.world_size,
            natoms=dataset_natoms(self.train_ds) if d.sampler == "balanced" and self.info.world_size > 1 else None,
            balanced=d.sampler == "balanced", shuffle=d.shuffle, seed=cfg.seed, train=True)
        self.steps_per_epoch = self.sampler.num_batches()
        if self.steps_per_epoch == 0:
            raise ConfigError(f"the training set ({len(self.train_ds)} samples) gives no batch of data.batch_size={d.batch_size}.")
        total = t.max_epochs * self.steps_per_epoch
        self.total_steps = min(total, t.max_steps) if t.max_steps else total
        warm = t.warmup_steps if t.warmup_steps is not None else int(round(t.warmup_epochs * self.steps_per_epoch))

        # ---------------------------------------------------------------- normalisers + model config
        elements = None
        if ckpt is not None:
            self.task.load_state_dict(ckpt["normalizers"])
            if ckpt.get("elements"):
                elements = ([int(z) for z in ckpt["elements"]], str(ckpt.get("elements_source", "checkpoint")))
            model_cfg = checkpoint_model_config(ckpt, ckpt["config"]["model"])
            check_same_model(model_cfg, model_dict(cfg.model), self.resumed_from)
        else:
            if self.info.is_main:
                norm = self.task.fit_normalizers(self.train_ds, t.normalizer)
                model_cfg = resolve_model_stats(model_dict(cfg.model), self.train_ds, seed=cfg.seed)
            else:
                norm, model_cfg = None, None
            norm, model_cfg = broadcast_object((norm, model_cfg), self.info)
            self.task.norm = norm
        if elements is None:  # a fresh run, or a checkpoint older than the field
            elements = broadcast_object(training_elements(self.train_ds, seed=cfg.seed) if self.info.is_main else None,
                                        self.info)
        self.elements, self.elements_source = elements
        self.model_cfg = model_cfg
        self.task.to(self.device)
        self.config_dict = to_container(cfg)
        self.config_dict["model"] = model_cfg

        # ---------------------------------------------------------------- model
        _set_seed(cfg.seed)  # identical initialisation on every rank
        self.module = build_model_from_config({"model": model_cfg}).to(self.device)
        self.amp = bool(t.amp and self.device.type == "cuda")
        self.grad_in_eval = t.grad_in_eval if t.grad_in_eval is not None else (
            model_cfg.get("regress_forces") == "gradient" or getattr(self.module, "regress_forces", None) == "gradient")
        self.optimizer = build_optimizer(self.module, lr=t.lr, weight_decay=t.weight_decay, betas=t.betas)
        self.lr_lambda = CosineWarmup(warmup_steps=warm, total_steps=self.total_steps,
                                      warmup_factor=t.warmup_factor, lr_min_factor=t.lr_min_factor)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_lambda)
        self.ema = EMA(self.module, decay=t.ema_decay) if t.ema_decay else None
        if self.info.enabled:
            self.model: nn.Module = nn.parallel.DistributedDataParallel(
                self.module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=t.find_unused_parameters)
        else:
            self.model = self.module
        self.step = 0
        self.epoch = 0
        self.position = 0
        self.bad_batches = 0
        self.best = {"metric": self.monitor, "value": float("inf"), "step": -1}
        self.history: List[Dict[str, float]] = []
        self.stop_signals = StopSignals(rank=self.info.rank)
        self.on_step_end: Optional[Callable[["Trainer"], None]] = None
        self.last_eval_step = -1
        self.final_results: Dict[str, Dict[str, float]] = {}
        self._eval_s = 0.0
        self.timing = {"steps": 0, "time": 0.0, "wait": 0.0, "samples": 0}
        self.epoch_timer = EpochTimer(steps_per_epoch=self.steps_per_epoch, device=self.device,
                                      warmup=t.epoch_time_warmup, steps=t.epoch_time_steps)
        if ckpt is not None:
            self._load_state(ckpt)
            self.log(f"[est.train] resumed from {self.resumed_from} at step {self.step} (epoch {self.epoch}, batch {self.position})")
        else:
            _set_seed(cfg.seed + 1000 * self.info.rank)
        names = self.task.metric_names()
        self.csv = MetricsCSV(os.path.join(self.run_dir, "metrics.csv"), names,
                              resume_step=self.step if ckpt is not None else None) if self.info.is_main else None
        self.tb = TensorBoard(os.path.join(self.run_dir, "tb"), enabled=t.tensorboard and self.info.is_main)
        nparam = sum(p.numel() for p in self.module.parameters())
        self.log(f"[est.train] task={d.task} model={model_cfg.get('name', model_cfg.get('_target_'))} params={nparam:,} "
                 f"train={len(self.train_ds)} " + " ".join(f"{k}={len(v)}" for k, v in self.datasets.items() if k != "train")
                 + f" world={self.info.world_size} device={self.device} steps={self.total_steps} "
                 f"({self.steps_per_epoch}/epoch, global batch {d.batch_size}) run_dir={self.run_dir}")

    # ==================================================================== state
    def state_dict(self) -> Dict[str, Any]:
        rngs = all_gather_object(rng_state(), self.info)
        return {
            "format": FORMAT_VERSION,
            "step": self.step, "epoch": self.epoch,
            "sampler": {"epoch": self.epoch, "position": self.position, "seed": self.sampler.seed},
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "normalizers": self.task.state_dict(),
            "rng": rngs,
            "world_size": self.info.world_size,
            "best": dict(self.best),
            "bad_batches": self.bad_batches,
            "last_eval_step": self.last_eval_step,
            "elements": list(self.elements),
            "elements_source": self.elements_source,
            "config": self.config_dict,
            "model_defaults": MODEL_DEFAULTS_VERSION,
        }

    def _load_state(self, ck: Dict[str, Any]) -> None:
        self.module.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        sched = dict(ck["scheduler"])
        sched["lr_lambdas"] = [None] * len(self.scheduler.lr_lambdas)  # ours is rebuilt from the config
        self.scheduler.load_state_dict(sched)
        if self.ema is not None and ck.get("ema") is not None:
            self.ema.load_state_dict(ck["ema"])
        self.step, self.epoch = int(ck["step"]), int(ck["epoch"])
        self.position = int(ck["sampler"]["position"])
        self.best = dict(ck["best"])
        self.bad_batches = int(ck.get("bad_batches", 0))
        self.last_eval_step = int(ck.get("last_eval_step", -1))
        rngs = ck.get("rng") or []
        if int(ck.get("world_size", 1)) == self.info.world_size and len(rngs) == self.info.world_size:
            set_rng_state(rngs[self.info.rank])
        else:
            warnings.warn("checkpoint was written with another number of processes: RNG streams are reseeded")
            _set_seed(self.cfg.seed + 7919 * self.step + 1000 * self.info.rank)

    def save(self, name: str = "last.pt") -> None:
        state = self.state_dict()  # collective (RNG gather): every rank calls it
        if self.info.is_main:
            save_checkpoint(state, os.path.join(self.run_dir, name))
        barrier(self.info)

    # ==================================================================== signals
    @property
    def _stop_signal(self) -> Optional[int]:
        """The first SIGTERM/SIGINT received during :meth:`fit` on this rank, or None."""
        return self.stop_signals.signum

    # ==================================================================== steps
    def _autocast(self):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _bad_batch(self, what: str, batch, detail: Optional[str] = None) -> None:
        """Count a skipped batch (collective); past ``max_bad_batches`` raise naming the step, ``detail`` and the ids."""
        self.bad_batches += 1
        ids = all_gather_object(batch_ids(batch, detail), self.info)
        msg = bad_batch_message(what, ids, step=self.step, epoch=self.epoch, position=self.position)
        if self.bad_batches > self.cfg.trainer.max_bad_batches:
            raise NonFiniteLossError(msg + ". The update was not applied (weights are intact). Fix: lower trainer.lr, "
                                     "check these samples, or allow skipping with trainer.max_bad_batches=N.")
        self.log(f"[est.train] skipping batch: {msg} ({self.bad_batches}/{self.cfg.trainer.max_bad_batches} allowed)")

    def nonfinite_inputs(self, batch, *, max_samples: int = 5) -> Optional[str]:
        """None when every float field of ``batch`` is finite, else the bad samples of the training set
        (:func:`~est.train.nonfinite.nonfinite_inputs`)."""
        return nonfinite_inputs(batch, self.train_ds, max_samples=max_samples)

    def train_step(self, batch) -> Optional[float]:
        """One optimiser step on this rank's share of a global batch; returns the local scaled loss or None if skipped."""
        self.model.train()
        bad_inputs = self.nonfinite_inputs(batch)
        flags = torch.tensor([1.0 if self._stop_signal else 0.0, 1.0 if bad_inputs else 0.0], dtype=torch.float64)
        glob = all_reduce_sum(torch.cat([self.task.local_counts(batch), flags]), self.info)
        self._stop_agreed = bool(glob[-2] > 0)
        counts = glob[:-2]
        if glob[-1] > 0:  # any rank: every rank skips together
            self.optimizer.zero_grad(set_to_none=True)
            self._bad_batch("non-finite input", batch, bad_inputs)
            return None
        with self._autocast():
            out = self.model(batch)
        if self.step == 0 or not getattr(self, "_checked", False):
            self.task.check_output(out, batch)
            self._checked = True
        loss = self.task.loss(out, batch, counts, self.info.world_size)
        bad = all_reduce_sum(torch.tensor([0.0 if torch.isfinite(loss).item() else 1.0], dtype=torch.float64), self.info)
        self.optimizer.zero_grad(set_to_none=True)
        if bad.item() > 0:
            self._bad_batch(f"non-finite loss ({loss.item()})", batch)
            return None
        loss.backward()
        clip = self.cfg.trainer.clip_grad_norm
        params = [p for p in self.module.parameters() if p.grad is not None]
        gnorm = torch.nn.utils.clip_grad_norm_(params, max_norm=clip if clip else float("inf"))
        if not torch.isfinite(gnorm):
            self.optimizer.zero_grad(set_to_none=True)
            self._bad_batch(f"non-finite gradient norm ({gnorm.item()})", batch)
            return None
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.module)
        return float(loss.detach())

    # ==================================================================== evaluation
    def eval_module(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.module

    def evaluate(self, split: str = "val", *, module: Optional[nn.Module] = None, collect: bool = False):
        """Metrics (and optionally predictions) of ``module`` (default: EMA weights) on ``split``."""
        return evaluate(module or self.eval_module(), self.task, self.datasets[split], data=self.cfg.data,
                        info=self.info, grad=self.grad_in_eval, amp=self.amp, prefetch=self.cfg.trainer.prefetch,
                        collect=collect)

    def _eval_and_checkpoint(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        try:
            return self._eval_and_checkpoint_inner()
        finally:
            self._eval_s += time.perf_counter() - t0  # kept out of the training step timing

    def _eval_and_checkpoint_inner(self) -> Dict[str, float]:
        m = self.evaluate("val") if "val" in self.datasets else {}
        self.last_eval_step = self.step
        if m:
            row = {"step": self.step, "epoch": self.epoch, "split": "val", "lr": self.lr(), **m}
            self.history.append(row)
            if self.csv:
                self.csv.write(row)
            self.tb.log("val", m, self.step)
            base = m.get("base_" + self.monitor, float("nan"))
            self.log(f"[est.train] step {self.step} val {self.monitor}={m[self.monitor]:.5g} "
                     f"{self.task.units.get(self.monitor, '')} (mean predictor {base:.5g}) loss={m['loss']:.5g}")
            improved = m[self.monitor] < self.best["value"]
            if improved:
                self.best = {"metric": self.monitor, "value": float(m[self.monitor]), "step": self.step}
        self.save("last.pt")
        if m and improved:
            self.save("best.pt")
        return m

    # ==================================================================== loop
    def _repair_best(self) -> None:
        """Make ``best.pt`` hold the evaluation ``self.best`` names (collective).

        ``last.pt`` is written before ``best.pt`` at an improving evaluation; a
        kill in between leaves a ``last.pt`` whose ``best.step`` is its own step
        and a ``best.pt`` one evaluation behind. Both would hold the same
        state, so ``last.pt`` is copied.
        """
        last = os.path.join(self.run_dir, "last.pt")
        if (self.info.is_main and self.resumed_from == last and self.best.get("step") == self.step == self.last_eval_step):
            repaired = repair_best(self.run_dir, self.step)
            if repaired:
                self.log(f"[est.train] {repaired}")
        barrier(self.info)

    def final_results_written(self) -> bool:
        """Whether ``final_metrics.json`` names this step (same answer on every rank)."""
        done = final_results_written(self.run_dir, self.step) if self.info.is_main else False
        return bool(broadcast_object(done, self.info))

    def _stop_requested(self) -> bool:
        """Whether any rank received SIGTERM/SIGINT (collective)."""
        flag = torch.tensor([1.0 if self._stop_signal else 0.0], dtype=torch.float64)
        return bool(all_reduce_sum(flag, self.info)[0] > 0)

    def _finish(self) -> str:
        """After the last step: last evaluation, final results (each only if missing); "finished" or "interrupted".

        SIGTERM/SIGINT here stops before the next split (``last.pt`` holds the
        final step); the same command then completes the final results.
        """
        with self.stop_signals.installed():
            if self._stop_requested():
                self.save("last.pt")
                results = None
            else:
                if self.last_eval_step != self.step:
                    self._eval_and_checkpoint()
                results = self.final_evaluation()
        if results is None:
            self.log(f"[est.train] interrupted at the end of training (step {self.step}): final results not written; "
                     "run the same command again to complete them")
            return "interrupted"
        self.final_results = results
        self.tb.close()
        return "finished"

    def fit(self) -> str:
        """Train until ``total_steps``, then write the final results; returns "finished" or "interrupted".

        A run past its last step finishes what is missing (see the module docstring).
        """
        t, d = self.cfg.trainer, self.cfg.data
        self._repair_best()
        if self.step >= self.total_steps:
            if self.final_results_written():
                self.log(f"[est.train] run already finished at step {self.step} ({self.resumed_from}); "
                         "use a new run_dir or trainer.resume=never to train again")
                return "finished"
            self.log(f"[est.train] training reached step {self.step} but the final results are missing "
                     "(interrupted at the end): completing them")
            return self._finish()
        loader = make_loader(self.train_ds, self.sampler, num_workers=d.num_workers, pin_memory=self.device.type == "cuda")
        try:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, disable=not (t.progress and self.info.is_main),
                       dynamic_ncols=True, desc="train")
        except ImportError:  # pragma: no cover
            bar = None
        status = "finished"
        win = {"loss": 0.0, "n": 0, "t0": time.perf_counter(), "samples": 0, "wait": 0.0, "eval0": self._eval_s}
        self._stop_agreed = False
        with self.stop_signals.installed():
            while self.step < self.total_steps:
                self.sampler.set_epoch(self.epoch, self.position)
                pf = Prefetcher(loader, self.device, enabled=t.prefetch)
                wait_seen = 0.0
                for batch in pf:
                    if batch.pos.device != self.device:
                        batch = batch.to(self.device)
                    n_local = torch.tensor([float(batch.num_graphs)], dtype=torch.float64)
                    t_step = time.perf_counter()
                    loss = self.train_step(batch)
                    self.step += 1
                    self.position += 1
                    win["wait"] += pf.wait_s - wait_seen
                    self.timing["wait"] += pf.wait_s - wait_seen
                    wait_seen = pf.wait_s
                    win["samples"] += int(n_local.item())
                    if loss is not None:
                        win["loss"] += loss
                        win["n"] += 1
                    estimate = self.epoch_timer.step_done(self._eval_s)
                    if estimate:
                        self.log(estimate)
                    if self.step % t.log_every == 0 or self.step == self.total_steps:
                        self._log_train(win, bar)
                    if bar is not None:
                        bar.update(1)
                    if t.eval_every and self.step % t.eval_every == 0:
                        self._eval_and_checkpoint()
                    elif t.save_every and self.step % t.save_every == 0:
                        self.save("last.pt")
                    if self.on_step_end is not None:
                        self.on_step_end(self)
                    if self._stop_agreed:
                        status = "interrupted"
                        break
                    if self.step >= self.total_steps:
                        break
                if status == "interrupted":
                    break
                if self.position >= self.steps_per_epoch:
                    self.epoch += 1
                    self.position = 0
                    if not t.eval_every:
                        self._eval_and_checkpoint()
        if bar is not None:
            bar.close()
        estimate = self.epoch_timer.finish(self._eval_s)  # a run shorter than warm-up + timed steps
        if estimate:
            self.log(estimate)
        if status == "interrupted":
            self.save("last.pt")
            self.log(f"[est.train] interrupted: saved {os.path.join(self.run_dir, 'last.pt')} at step {self.step}; "
                     "run the same command again to resume")
            return status
        return self._finish()

    def _log_train(self, win, bar) -> None:
        vec = all_reduce_sum(torch.tensor([win["loss"], float(win["n"]), float(win["samples"])], dtype=torch.float64), self.info)
        loss = float(vec[0] / max(vec[1], 1.0) / self.info.world_size)
        dt = time.perf_counter() - win["t0"] - (self._eval_s - win["eval0"])
        rate = float(vec[2]) / max(dt, 1e-9)
        wait = win["wait"] / max(dt, 1e-9)
        row = {"step": self.step, "epoch": self.epoch, "split": "train", "lr": self.lr(), "loss": loss,
               "samples_per_s": rate, "data_wait": wait, "step_s": dt / max(win["n"], 1)}
        self.timing["steps"] += win["n"]
        self.timing["time"] += dt
        self.timing["samples"] += int(vec[2])
        self.history.append(row)
        if self.csv:
            self.csv.write(row)
        self.tb.log("train", {"loss": loss, "lr": row["lr"], "samples_per_s": rate, "data_wait": wait}, self.step)
        if bar is not None and not bar.disable:
            bar.set_postfix(loss=f"{loss:.4g}", lr=f"{row['lr']:.2e}", rate=f"{rate:.1f}/s", wait=f"{100 * wait:.0f}%")
        elif not self.cfg.trainer.progress:
            self.log(f"[est.train] step {self.step}/{self.total_steps} loss={loss:.5g} lr={row['lr']:.3e} "
                     f"{rate:.1f} samples/s data-wait {100 * wait:.1f}%")
        win.update(loss=0.0, n=0, t0=time.perf_counter(), samples=0, wait=0.0, eval0=self._eval_s)

    # ==================================================================== end of run
    def final_evaluation(self) -> Optional[Dict[str, Dict[str, float]]]:
        """Best weights on ``trainer.final_splits``: summary table (model vs mean predictor), parity + learning-curve PNGs.

        Returns None, writing no ``final_metrics.json``, when SIGTERM/SIGINT arrives (checked between splits).
        """
        t = self.cfg.trainer
        best_path = os.path.join(self.run_dir, "best.pt")
        module = self.eval_module()
        if os.path.isfile(best_path):
            module = build_model_from_config({"model": self.model_cfg}).to(self.device)
            module.load_state_dict(model_state(load_checkpoint(best_path)))
        results: Dict[str, Dict[str, float]] = {}
        preds: Dict[str, Dict[str, np.ndarray]] = {}
        if self.csv:  # rows of an earlier, interrupted final evaluation
            self.csv.drop_rows(lambda r: str(r.get("split", "")).startswith("final_"))
        for s in t.final_splits:
            if s in self.datasets and len(self.datasets[s]):
                if self._stop_requested():
                    return None
                results[s], preds[s] = self.evaluate(s, module=module, collect=True)
                row = {"step": self.step, "epoch": self.epoch, "split": f"final_{s}", **results[s]}
                if self.csv:
                    self.csv.write(row)
        if self._stop_requested():
            return None
        if self.info.is_main:
            write_final_report(self.run_dir, task=self.task, results=results, preds=preds, step=self.step,
                               best=self.best, monitor=self.monitor, timing=getattr(self, "timing", None), plots=t.plots)
        barrier(self.info)
        return results


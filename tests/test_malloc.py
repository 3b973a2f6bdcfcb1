"""est.train.malloc and trainer.keep_freed_memory: freed large blocks stay in the process (glibc only).

The allocator setting is process-wide, so the memory checks run in fresh
subprocesses; the trainer test replaces the call with a recorder."""
import platform
import subprocess
import sys

import pytest

from est.train import malloc
from est.train.config import load_config
from est.train.trainer import Trainer

from test_train_helpers import emt_samples

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: RSS (MiB, /proc/self/statm) after touching a 256 MiB tensor, after freeing it, after a 240 MiB one
PROBE = """
import os, sys
import torch
from est.train.malloc import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * page / 2**20
base = rss()
x = torch.ones(64 * 2**20)  # 256 MiB, every page touched
held = rss() - base
del x
freed = rss() - base
y = torch.ones(60 * 2**20)  # 240 MiB: fits in the freed block
again = rss() - base
print(kept, round(held), round(freed), round(again))
"""


def _probe(mode: str) -> tuple[str, int, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True, text=True).stdout.split()
    return out[0], int(out[1]), int(out[2]), int(out[3])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_freed_large_blocks_go_back_to_the_kernel_by_default_and_stay_when_kept():
    kept, held, freed, again = _probe("default")
    assert held >= 250 and freed <= 20, (held, freed)  # glibc mmaps a 256 MiB block and unmaps it on free
    kept, held, freed, again = _probe("keep")
    assert kept == "True"
    assert held >= 250 and freed >= 250, (held, freed)  # freed, not returned: the heap keeps it
    assert again <= held + 20, (held, again)  # the next tensor reuses the freed block: no new pages


def test_keep_freed_memory_reports_what_it_did(monkeypatch):
    monkeypatch.setattr(malloc, "_glibc", lambda: None)
    assert malloc.keep_freed_memory() is False  # not glibc: nothing changed, and it says so


@pytest.mark.parametrize("flag", [False, True])
def test_trainer_applies_the_setting_on_cpu_only_when_asked(flag, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("est.train.trainer.keep_freed_memory", lambda: calls.append(1) or True)
    cfg = load_config(["data=oc20_s2ef", "model._target_=test_train_helpers.PairModel", "model.name=pair",
                       f"run_dir={tmp_path}", "data.batch_size=4", "data.num_workers=0", "trainer.progress=false",
                       "trainer.plots=false", "trainer.tensorboard=false", "trainer.device=cpu",
                       f"trainer.keep_freed_memory={str(flag).lower()}"], check=False)
    Trainer(cfg, datasets={"train": emt_samples(4, 0), "val": emt_samples(2, 1)})
    assert calls == ([1] if flag else [])

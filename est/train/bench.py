"""Training throughput on 1 and more processes: step time, samples/s and the share of time waiting for data.

    python -m est.train.bench --procs 1 2 -- +experiment=oc20_s2ef_quick trainer.max_steps=30

Each process count runs ``train.py`` under ``torch.distributed.run`` (gloo on
CPU, nccl on GPU) with the given overrides in a fresh run folder, with
evaluation pushed to the end, and reads the trainer's timing from
``final_metrics.json``: ms per optimiser step, samples/s (global), and data
wait = time the training loop waited for the next batch / training time
(the prefetcher prepares batches one step ahead; target under 5%).
CPU threads are split evenly between processes and recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List

__all__ = ["main"]


def main(argv: List[str] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, overrides = argv[:i], argv[i + 1 :]
    else:
        own, overrides = argv, []
    p = argparse.ArgumentParser(prog="python -m est.train.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads in total")
    p.add_argument("--train-py", default=os.path.join(os.path.dirname(__file__), "..", "..", "train.py"))
    a = p.parse_args(own)
    rows = []
    for k in a.procs:
        run_dir = tempfile.mkdtemp(prefix=f"est-bench-{k}p-")
        threads = max(1, a.threads // k)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={k}",
               os.path.abspath(a.train_py), *overrides, f"run_dir={run_dir}", "trainer.resume=never",
               "trainer.eval_every=1000000000", "trainer.final_splits=[]", "trainer.plots=false", "trainer.progress=false"]
        t0 = time.time()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
            return res.returncode
        tm = json.load(open(os.path.join(run_dir, "final_metrics.json")))["timing"]
        rows.append({"procs": k, "threads_per_proc": threads, "steps": tm["steps"],
                     "ms_per_step": 1000 * tm["time"] / max(tm["steps"], 1),
                     "samples_per_s": tm["samples"] / max(tm["time"], 1e-9),
                     "data_wait_pct": 100 * tm["wait"] / max(tm["time"], 1e-9), "wall_s": time.time() - t0})
    print(f"{'procs':>5} {'thr/proc':>8} {'steps':>6} {'ms/step':>9} {'samples/s':>10} {'data wait':>9}")
    for r in rows:
        print(f"{r['procs']:>5} {r['threads_per_proc']:>8} {r['steps']:>6} {r['ms_per_step']:>9.1f} "
              f"{r['samples_per_s']:>10.2f} {r['data_wait_pct']:>8.2f}%")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

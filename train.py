#!/usr/bin/env python
"""Train or evaluate EST / EquiformerV2 models on QM9 and OC20.

    python train.py +experiment=qm9_quick
    python train.py +experiment=oc20_s2ef_quick trainer.max_epochs=2 run_dir=runs/s2ef
    torchrun --nproc_per_node 4 train.py +experiment=oc20_s2ef data.train_path=... data.val_path=...
    python train.py mode=eval ckpt=runs/qm9_quick/best.pt eval_splits=[test]

Multi-node (SLURM, one task per node; torchrun starts the per-GPU processes):

    srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc_per_node 8 \
        --rdzv_backend c10d --rdzv_endpoint $(scontrol show hostnames $SLURM_NODELIST | head -1):29500 \
        --rdzv_id $SLURM_JOB_ID train.py +experiment=oc20_s2ef data.train_path=... data.val_path=...

``data.batch_size`` is the global batch. SIGTERM (e.g. SLURM preemption with
``--signal=TERM@120``) saves ``run_dir/last.pt``; the same command resumes.
See ``python train.py --help`` and est/train/cli.py.
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from est.train.cli import main

    sys.exit(main(config_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")))

#!/usr/bin/env python3
"""DeepSpeed's side of deepspeed_dynamic_batching_interop_test (DeepSpeed 0.19.8, which has
dynamic batching; 0.15.4 has not). Reads WORK_DIR/cases.json and writes WORK_DIR/deepspeed.json:
- for each packing case, DeepSpeed's batch_by_seqlens(seqlens, **options) (micro-batch ids,
  batch sizes, longest sequences);
- for each rate case, the learning rate each of its updates trains with under DeepSpeed's
  VariableBatchSizeLR over its WarmupLR (or over the optimizer's constant rate), stepped as its
  engine steps a scheduler: after every optimizer step; and the scheduler's state_dict after
  save_at steps (what DeepSpeed's checkpoint keeps);
- for each resume case, the rate after loading the C++ scheduler's saved state into a fresh
  VariableBatchSizeLR (as DeepSpeed's load_checkpoint does) and stepping it once.

usage: deepspeed_dynamic_batching_interop.py WORK_DIR"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import (  # noqa
    batch_by_seqlens, lr_scheduler_for_variable_batch_size)
from deepspeed.runtime.lr_schedules import WarmupLR  # noqa: E402


def main():
    work = sys.argv[1]
    cases = json.load(open(f"{work}/cases.json"))
    packings = []
    for case in cases["packings"]:
        ids, sizes, longest = batch_by_seqlens(case["seqlens"], **case["options"])
        packings.append({"microbatch_ids": [[int(b), [int(s) for s in mb]] for b, mb in ids],
                         "batch_sizes": [int(n) for n in sizes],
                         "batch_max_seqlens": [int(n) for n in longest]})

    def scheduler_for(case):
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=case["lr"])
        base = optimizer
        if case["warmup"]:
            base = WarmupLR(optimizer, **case["warmup"])
        return optimizer, lr_scheduler_for_variable_batch_size(
            base_batch_size=case["base_batch_size"], batch_sizes=case["batch_sizes"],
            dataloader=None, lr_scheduler_or_optimizer=base, lr_scaling_method=case["method"])

    rates, states = [], []
    for case in cases["rates"]:
        optimizer, scheduler = scheduler_for(case)
        used = []
        for n in range(case["steps"]):
            if n == case["save_at"]:
                states.append(scheduler.state_dict())
            used.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        rates.append(used)

    resumed = []
    for case in cases["resumes"]:
        optimizer, scheduler = scheduler_for(case)
        scheduler.load_state_dict(case["state"])
        optimizer.step()
        scheduler.step()
        resumed.append(optimizer.param_groups[0]["lr"])

    with open(f"{work}/deepspeed.json", "w") as f:
        json.dump({"packings": packings, "rates": rates, "states": states, "resumed": resumed}, f)


if __name__ == "__main__":
    main()

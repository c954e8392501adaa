#!/usr/bin/env python3
"""Prints DeepSpeed's random-LTD schedules (RandomLTDScheduler: the kept length after
update_seq(t), the consumed layer-tokens, get_total_layer_tokens) in the form
tests/unit/runtime/random_ltd_test.cpp embeds. Needs DeepSpeed's sources: either `deepspeed`
installed, or DS_SRC=<checkout>/deepspeed (scheduler.py is loaded on its own, with DeepSpeed's
logger stubbed). The committed values came from deepspeedai/DeepSpeed ac0bde6, whose schedule
never falls below min_value's multiple of seq_per_step; edaa722 and the releases before it
lack that floor and keep 0 tokens at UnalignedMin's step 0 (the other values are the same)."""
import logging
import os
import sys
import types

from ds_source import load


def scheduler_class():
    src = os.environ.get("DS_SRC")
    if not src:
        from deepspeed.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler
        return RandomLTDScheduler
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logging.getLogger("deepspeed")
    for name in ("deepspeed", "routing"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["deepspeed.utils"] = utils
    load(os.path.join(src, "runtime/data_pipeline/constants.py"), "routing.constants")
    scheduler = load(os.path.join(src, "runtime/data_pipeline/data_routing/scheduler.py"),
                     "routing.data_routing.scheduler", "routing.data_routing")
    return scheduler.RandomLTDScheduler


# (name, total layers, dropping layers, global batch, min, max, require_steps, seq_per_step,
#  global steps): each update_seq(t) in order.
SCHEDULES = [
    ("Linear", 4, 2, 8, 16, 128, 10, 16, range(0, 13)),
    ("UnalignedMin", 6, 3, 4, 10, 100, 7, 16, range(0, 10)),
    ("RepeatedSteps", 3, 1, 2, 8, 32, 4, 8, [0, 0, 1, 1, 2, 3, 3, 4, 5]),
]


def main():
    RandomLTDScheduler = scheduler_class()
    for name, total, dropping, batch, lo, hi, steps_to_max, per_step, steps in SCHEDULES:
        config = {"total_layer_num": total, "random_ltd_layer_num": dropping,
                  "global_batch_size": batch,
                  "random_ltd_schedule": {"min_value": lo, "max_value": hi,
                                          "schedule_type": "fixed_linear",
                                          "schedule_config": {"require_steps": steps_to_max,
                                                              "seq_per_step": per_step}},
                  "layer_token_lr_schedule": {"enabled": False}}
        scheduler = RandomLTDScheduler(config)
        seqs, tokens = [], []
        for t in steps:
            scheduler.update_seq(t)
            seqs.append(scheduler.get_current_seq())
            tokens.append(scheduler.state["consumed_layer_tokens"])
        total_tokens = RandomLTDScheduler(config).get_total_layer_tokens(len(list(steps)))
        print(f"// {name}: steps {list(steps)}")
        print("{" + ", ".join(str(v) for v in seqs) + "},")
        print("{" + ", ".join(str(v) for v in tokens) + "},")
        print(f"get_total_layer_tokens({len(list(steps))}) = {total_tokens}")


if __name__ == "__main__":
    main()

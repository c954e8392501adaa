#!/usr/bin/env python3
"""Prints DeepSpeed's pipeline instruction streams in the form tests/unit/pipe/schedule_test.cpp
embeds. Needs DeepSpeed's schedule.py importable: either `deepspeed` installed, or
DS_SCHEDULE_PY=<path to deepspeed/runtime/pipe/schedule.py> (its relative import of call_to_str
is replaced by a local copy). The committed strings came from deepspeedai/DeepSpeed edaa7221."""
import importlib.util
import os
import sys
import types


def call_to_str(base, *args, **kwargs):
    name = f"{base}("
    if args:
        name += ", ".join(repr(a) for a in args)
        if kwargs:
            name += ", "
    if kwargs:
        name += ", ".join(f"{k}={repr(v)}" for k, v in kwargs.items())
    return name + ")"


def load_schedule():
    path = os.environ.get("DS_SCHEDULE_PY")
    if not path:
        from deepspeed.runtime.pipe import schedule
        return schedule
    src = open(path).read().replace("from ..utils import call_to_str", "")
    module = types.ModuleType("schedule")
    module.call_to_str = call_to_str
    exec(compile(src, path, "exec"), module.__dict__)
    return module


def main():
    S = load_schedule()
    for (P, m) in [(2, 4), (4, 4), (3, 2)]:
        for kind in ("train", "inference"):
            for s in range(P):
                cls = S.TrainSchedule if kind == "train" else S.InferenceSchedule
                sch = cls(micro_batches=m, stages=P, stage_id=s)
                steps = [" ".join(repr(c) for c in cmds) for cmds in sch.steps()]
                print(f'  {{"{kind}", {P}, {m}, {s}, {sch.num_pipe_buffers()},')
                print('   "' + " | ".join(steps) + '"},')


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Prints DeepSpeed's legacy curriculum schedules and progressive-layer-drop thetas in the form
tests/unit/runtime/curriculum_scheduler_test.cpp embeds. Needs DeepSpeed's sources: either
`deepspeed` installed, or DS_SRC=<checkout>/deepspeed (the three files are loaded on their own,
with DeepSpeed's logger stubbed). The committed values came from deepspeedai/DeepSpeed 5674e63,
which has PR #8334 (the schedule never starts below min_difficulty; before it, FixedLinearFloorRaised
began at 0)."""
import logging
import os
import sys
import types

from ds_source import load


def modules():
    src = os.environ.get("DS_SRC")
    if not src:
        from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
        from deepspeed.runtime.progressive_layer_drop import ProgressiveLayerDrop
        return CurriculumScheduler, ProgressiveLayerDrop
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logging.getLogger("deepspeed")
    utils.log_dist = lambda *args, **kwargs: None
    for name in ("deepspeed", "deepspeed.runtime", "pipeline"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["deepspeed.utils"] = utils
    load(os.path.join(src, "runtime/data_pipeline/constants.py"), "pipeline.constants")
    scheduler = load(os.path.join(src, "runtime/data_pipeline/curriculum_scheduler.py"),
                     "pipeline.curriculum_scheduler", "pipeline")
    pld = load(os.path.join(src, "runtime/progressive_layer_drop.py"), "pld")
    return scheduler.CurriculumScheduler, pld.ProgressiveLayerDrop


# (name, config, global steps): each config's difficulty after update_difficulty(t), t in order.
SCHEDULES = [
    ("FixedLinear", {"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
                     "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}},
     range(1, 13)),
    ("FixedRootSquare", {"min_difficulty": 16, "max_difficulty": 128,
                         "schedule_type": "fixed_root",
                         "schedule_config": {"total_curriculum_step": 20, "difficulty_step": 8,
                                             "root_degree": 2}},
     range(0, 23)),
    ("FixedLinearFloorRaised", {"min_difficulty": 8, "max_difficulty": 64,
                                "schedule_type": "fixed_linear",
                                "schedule_config": {"total_curriculum_step": 20,
                                                    "difficulty_step": 16}},
     range(0, 11)),
    ("FixedRootCube", {"min_difficulty": 8, "max_difficulty": 64,
                              "schedule_type": "fixed_root",
                              "schedule_config": {"total_curriculum_step": 10,
                                                  "difficulty_step": 16, "root_degree": 3}},
     range(1, 12)),
    ("FixedLinearUnalignedMin", {"min_difficulty": 5, "max_difficulty": 100,
                                 "schedule_type": "fixed_linear",
                                 "schedule_config": {"total_curriculum_step": 7,
                                                     "difficulty_step": 10}},
     range(1, 10)),
    ("FixedDiscrete", {"min_difficulty": 1, "max_difficulty": 3,
                       "schedule_type": "fixed_discrete",
                       "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]}},
     range(1, 13)),
]

# (theta, gamma, global steps): theta after update_state(t).
PLD = [(0.5, 0.001, [0, 1, 10, 100, 1000, 10000]), (0.2, 0.01, [0, 3, 50, 400])]


def main():
    CurriculumScheduler, ProgressiveLayerDrop = modules()
    for name, config, steps in SCHEDULES:
        scheduler = CurriculumScheduler(dict(config))
        steps = list(steps)
        values = [scheduler.update_difficulty(t) for t in steps]
        print(f"// {name}: steps {steps[0]}..{steps[-1]}")
        print("{" + ", ".join(str(v) for v in values) + "},")
    for theta, gamma, steps in PLD:
        pld = ProgressiveLayerDrop(theta=theta, gamma=gamma)
        values = []
        for t in steps:
            pld.update_state(t)
            values.append(repr(float(pld.get_theta())))
        print(f"// theta {theta} gamma {gamma}: steps {steps}")
        print("{" + ", ".join(values) + "},")


if __name__ == "__main__":
    main()

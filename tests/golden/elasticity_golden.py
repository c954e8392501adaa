#!/usr/bin/env python3
"""Prints what DeepSpeed's compute_elastic_config answers for the configs of
tests/unit/config/elasticity_test.cpp, in the form that test embeds. Needs DeepSpeed's sources:
either `deepspeed` installed, or DS_SRC=<checkout>/deepspeed (elasticity.py, config.py and
constants.py are loaded on their own, with DeepSpeed's logger and version stubbed; numpy is
needed, `packaging` is stubbed when missing). The committed values came from deepspeedai/DeepSpeed
edaa722."""
import logging
import os
import sys
import types

from ds_source import load


def ds_elasticity():
    src = os.environ.get("DS_SRC")
    if not src:
        import deepspeed.elasticity.elasticity as elasticity
        return elasticity
    utils = types.ModuleType("ds.utils")
    utils.logger = logging.getLogger("deepspeed")
    version = types.ModuleType("ds.git_version_info")
    version.version = "0.18.0"
    for name, module in (("ds", types.ModuleType("ds")), ("ds.utils", utils),
                         ("ds.git_version_info", version),
                         ("ds.elasticity", types.ModuleType("ds.elasticity"))):
        sys.modules[name] = module
    try:
        import packaging.version  # noqa: F401
    except ImportError:
        packaging = types.ModuleType("packaging")
        packaging.version = types.ModuleType("packaging.version")
        packaging.version.parse = lambda v: tuple(int(x) for x in v.split("."))
        sys.modules["packaging"] = packaging
        sys.modules["packaging.version"] = packaging.version
    for name in ("constants", "config"):
        load(os.path.join(src, "elasticity", name + ".py"), "ds.elasticity." + name,
             "ds.elasticity")
    return load(os.path.join(src, "elasticity", "elasticity.py"), "ds.elasticity.elasticity",
                "ds.elasticity")


BASE = {"enabled": True, "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17],
        "min_gpus": 32, "max_gpus": 1500, "min_time": 20, "version": 0.1}

# (name, elasticity section overrides of BASE, world sizes; 0 = none given)
CASES = [
    ("DeepSpeedsTestConfigV01", {}, [0, 64, 128, 34]),
    ("ProperMicroBatch", {"max_train_batch_size": 32, "micro_batch_sizes": [1, 2, 3, 7],
                          "min_gpus": 1}, [0, 4, 7, 1]),
    ("PreferSmallerV01", {"prefer_larger_batch": False, "min_gpus": 1, "max_gpus": 64}, [0, 16]),
    ("FewGpusV01", {"max_train_batch_size": 100, "micro_batch_sizes": [2, 5], "min_gpus": 3,
                    "max_gpus": 9}, [0, 5]),
    ("LargeMicroV01", {"max_train_batch_size": 100, "micro_batch_sizes": [2, 40], "min_gpus": 3,
                       "max_gpus": 9}, [0, 2]),
    ("TinyShareV01", {"max_train_batch_size": 60, "micro_batch_sizes": [2, 30], "min_gpus": 3,
                      "max_gpus": 9}, [0]),
    ("HugeBatchV01", {"max_train_batch_size": 2000000, "micro_batch_sizes": [2],
                      "min_gpus": 1, "max_gpus": 6}, [0, 4]),
    ("DefaultsV02", {"max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
                     "min_gpus": 1, "max_gpus": 10000, "version": 0.2}, [1, 2, 3, 4, 5, 7, 8, 16]),
    ("ModelParallelV02", {"model_parallel_size": 4, "num_gpus_per_node": 8, "min_gpus": 8,
                          "max_gpus": 256, "version": 0.2}, [2, 4, 6, 16, 24]),
    ("NodesV02", {"num_gpus_per_node": 4, "max_train_batch_size": 1000,
                  "micro_batch_sizes": [2, 3, 5], "min_gpus": 4, "max_gpus": 64,
                  "version": 0.2}, [4, 6, 8, 12, 20]),
    ("PreferSmallerV02", {"prefer_larger_batch": False, "max_train_batch_size": 500,
                          "micro_batch_sizes": [4, 6], "min_gpus": 1, "max_gpus": 32,
                          "version": 0.2}, [2, 3, 9]),
]


def answer(elasticity, section, world):
    try:
        out = elasticity.compute_elastic_config({"elasticity": section}, "0.18.0",
                                                world_size=world)
    except Exception as error:  # noqa: BLE001: the class is what the test checks
        return "error", type(error).__name__
    if world == 0:
        return "ok", (int(out[0]), list(out[1]), 0)
    return "ok", (int(out[0]), list(out[1]), int(out[2]))


def main():
    elasticity = ds_elasticity()
    print("// tests/golden/elasticity_golden.py")
    for name, overrides, worlds in CASES:
        section = dict(BASE, **overrides)
        for world in worlds:
            kind, value = answer(elasticity, section, world)
            if kind == "error":
                print(f'{{"{name}", {world}, 0, {{}}, 0, "{value}"}},')
            else:
                final, valid, micro = value
                valid_text = ", ".join(str(v) for v in valid)
                print(f'{{"{name}", {world}, {final}, {{{valid_text}}}, {micro}, ""}},')


if __name__ == "__main__":
    main()

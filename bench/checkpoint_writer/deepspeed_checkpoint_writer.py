#!/usr/bin/env python3
"""DeepSpeed's peer of checkpoint_writer_bench.cpp: the same MLP (--layers Linear(H, H) + tanh,
loss = output squared, mean), batch, ZeRO stage and rounds, trained by DeepSpeed on CPU in one
process; per round --steps training steps alone, then the same steps after a save_checkpoint
under the given checkpoint.writer (committed at the end: DeepSpeed's decoupled engine commits at
the next step). One JSON line per round with the C++ bench's keys.

    DS_ACCELERATOR=cpu .venv-deepspeed-torch2/bin/python \\
        bench/checkpoint_writer/deepspeed_checkpoint_writer.py --dir /tmp/x --writer none
"""
import argparse
import json
import os
import shutil
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.dont_write_bytecode = True

import torch  # noqa: E402
import deepspeed  # noqa: E402


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--writer", default="none", help="checkpoint.writer as JSON, or none")
    p.add_argument("--dir", required=True)
    p.add_argument("--name", default="")
    a = p.parse_args()
    # One process without a launcher: the variables DeepSpeed's launcher sets (its checkpoint
    # writers read CROSS_SIZE, the node count).
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_SIZE", "1"),
                 ("CROSS_RANK", "0"), ("CROSS_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    cfg = {"train_batch_size": a.batch,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": a.stage},
           "steps_per_print": 1000000}
    if a.writer != "none":
        cfg["checkpoint"] = {"writer": json.loads(a.writer)}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    torch.manual_seed(1)
    x = torch.randn(a.batch, a.hidden)

    def train(n):
        for _ in range(n):
            engine.backward(engine(x).pow(2).mean())
            engine.step()

    train(2)
    for r in range(a.rounds):
        start = time.perf_counter()
        train(a.steps)
        alone = time.perf_counter() - start
        shutil.rmtree(a.dir, ignore_errors=True)
        start = time.perf_counter()
        engine.save_checkpoint(a.dir)
        call = time.perf_counter() - start
        train(a.steps)  # DeepSpeed commits a decoupled save in the first of these steps
        with_save = time.perf_counter() - start
        print(json.dumps({"variant": a.name, "round": r, "steps_s": round(alone, 4),
                          "steps_with_save_s": round(with_save, 4),
                          "save_call_s": round(call, 4), "bytes": folder_bytes(a.dir)}),
              flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    engine.destroy()


if __name__ == "__main__":
    main()

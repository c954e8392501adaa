#!/usr/bin/env python3
"""Interop check: do deepspeed-cpp's universal checkpoints agree with Python DeepSpeed's?

Not part of ctest (it needs torch and deepspeed >= 0.16, whose ds_to_universal converts ZeRO-3).
For a tag folder that train_gpt wrote (the example GPT; bench/gpu/gpt_model.py is the same model
in Python):
  a. converts it with our ds_to_universal and with DeepSpeed's
     `python -m deepspeed.checkpoint.ds_to_universal`, and compares every parameter's fp32,
     exp_avg and exp_avg_sq (DeepSpeed's ZeRO-3 conversion saves them flat and bare: compared by
     value) and the step count;
     (skipped for a ZeRO-0 source, which DeepSpeed's converter does not read);
  b. loads our universal folder in DeepSpeed (`checkpoint.load_universal`, ZeRO --stage, on
     --world gloo ranks, a client torch AdamW) and checks every parameter's fp32 master and Adam
     moments against our files, the global step, and that one training step runs.
Prints "OK" at the end, or the differences and exits 1.

    DS_ACCELERATOR=cpu python tests/e2e/deepspeed_universal_interop.py CKPT/global_step3 \\
        --ds_to_universal build/bin/ds_to_universal --n_layer 2 --n_embd 64 --vocab 15292 \\
        --stage 3 --world 2 --bf16
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu"))
from gpt_model import GptModel  # noqa: E402
from peer_exit import leave  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tag_dir", help="a checkpoint tag folder (CKPT/global_stepN)")
    p.add_argument("--ds_to_universal", default="build/bin/ds_to_universal")
    p.add_argument("--out", default="", help="work folder (default: <tag_dir>_interop)")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    return p.parse_args()


def load_state(path):
    d = torch.load(path, map_location="cpu", weights_only=False)
    return d["param"] if isinstance(d, dict) else d


def zero_stage_of(tag_dir):
    """The ZeRO stage the source was saved with (its model states' ds_config)."""
    for name in sorted(os.listdir(tag_dir)):
        if name.endswith("_model_states.pt"):
            sd = torch.load(os.path.join(tag_dir, name), map_location="cpu", weights_only=False)
            return (sd.get("ds_config") or {}).get("zero_optimization", {}).get("stage", 0)
    raise SystemExit(f"{tag_dir}: no model states file")


def convert(args, out):
    ours, theirs = os.path.join(out, "ours", "universal"), os.path.join(out, "theirs", "universal")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([args.ds_to_universal, "--input_folder", args.tag_dir, "--output_folder", ours],
                   check=True, stdout=subprocess.DEVNULL)
    if zero_stage_of(args.tag_dir) == 0:
        return ours, None  # stage 0 keeps its optimizer in the model states: DeepSpeed's tool refuses
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                    args.tag_dir, "--output_folder", theirs, "--num_extract_workers", "1",
                    "--num_merge_workers", "1",
                    # Without tensor parallelism the engine records no universal_checkpoint_info.
                    "--inject_missing_state"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return ours, theirs


def compare_conversions(ours, theirs):
    problems = []
    zo, zt = os.path.join(ours, "zero"), os.path.join(theirs, "zero")
    names = sorted(n for n in os.listdir(zo) if os.path.isdir(os.path.join(zo, n)))
    theirs_names = sorted(n for n in os.listdir(zt) if os.path.isdir(os.path.join(zt, n)))
    if names != theirs_names:
        problems.append(f"parameters differ: {sorted(set(names) ^ set(theirs_names))}")
    compared = 0
    for name in sorted(set(names) & set(theirs_names)):
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            a = os.path.join(zo, name, key + ".pt")
            b = os.path.join(zt, name, key + ".pt")
            if not (os.path.exists(a) and os.path.exists(b)):
                if os.path.exists(a) != os.path.exists(b):
                    problems.append(f"{name}/{key}.pt only in {'ours' if os.path.exists(a) else 'theirs'}")
                continue
            ta, tb = load_state(a), load_state(b)
            if ta.dtype != tb.dtype or not torch.equal(ta.reshape(-1), tb.reshape(-1)):
                problems.append(f"{name}/{key}: ours {tuple(ta.shape)} {ta.dtype}, theirs "
                                f"{tuple(tb.shape)} {tb.dtype} differ")
            compared += 1
    so = torch.load(os.path.join(zo, "optimizer_state.pt"), weights_only=False)
    st = torch.load(os.path.join(zt, "optimizer_state.pt"), weights_only=False)
    if so["param_groups"] != st["param_groups"]:
        problems.append("optimizer_state.pt param_groups differ")
    print(f"conversions: {len(names)} parameters, {compared} states compared", flush=True)
    return problems


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_in_deepspeed(rank, args, universal_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world))
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "bf16": {"enabled": args.bf16}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": args.stage}, "checkpoint": {"load_universal": True}}
    if args.stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = GptModel(args.n_layer, args.n_embd, args.n_head, args.seq_len, args.vocab)
        # The output projection uses wte.weight outside wte's forward.
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
    else:
        model = GptModel(args.n_layer, args.n_embd, args.n_head, args.seq_len, args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    folder = os.path.dirname(universal_dir)
    path, _ = engine.load_checkpoint(folder, tag=os.path.basename(universal_dir))
    problems = [] if path else [f"DeepSpeed loaded nothing from {universal_dir}"]
    zero = os.path.join(universal_dir, "zero")
    for name, p in model.named_parameters():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            got = (safe_get_full_fp32_param(p) if key == "fp32"
                   else safe_get_full_optimizer_state(p, key))
            want = load_state(os.path.join(zero, name, key + ".pt"))
            if got is None or not torch.equal(got.float().reshape(-1), want.float().reshape(-1)):
                problems.append(f"rank {rank}: {name} {key} differs from ours")
    # The saved counter (step.pt is the optimizer's count, which is one more for a source that
    # DeepSpeed's FP16_(Unfused)Optimizer wrote: it steps once at its start to create the state).
    saved_step = torch.load(os.path.join(universal_dir, "mp_rank_00_model_states.pt"),
                            weights_only=False)["global_steps"]
    if engine.global_steps != saved_step:
        problems.append(f"global_steps {engine.global_steps}, the checkpoint's {saved_step}")
    x = torch.randint(0, args.vocab, (1, args.seq_len))
    loss = engine(x, torch.roll(x, -1, 1))
    engine.backward(loss)
    engine.step()
    if not torch.isfinite(loss):
        problems.append(f"rank {rank}: loss {loss.item()} after loading")
    if rank == 0:
        print(f"DeepSpeed {deepspeed.__version__} ZeRO-{args.stage} on {args.world} ranks loaded "
              f"{universal_dir} (global_steps {engine.global_steps}); one step: loss "
              f"{loss.item():.4f}", flush=True)
    for p in problems[:20]:
        print(p, flush=True)
    leave(1 if problems else 0)


def main():
    args = parse_args()
    out = args.out or args.tag_dir.rstrip("/") + "_interop"
    ours, theirs = convert(args, out)
    problems = compare_conversions(ours, theirs) if theirs else []
    for p in problems[:20]:
        print(p, flush=True)
    try:
        mp.spawn(load_in_deepspeed, args=(args, ours, free_port()), nprocs=args.world, join=True)
    except mp.ProcessExitedException:
        problems.append("DeepSpeed's load of our universal checkpoint failed")
    if problems:
        print(f"FAILED: {len(problems)} problem(s)")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()

"""What the two Python peers (torch_gpt.py, deepspeed_gpt.py) share: their flags, random token
batches, the timed training loop and the RESULT line bench.py reads.

The loop times each optimizer step (forward, backward, step, then loss.item() as train_gpt
does, plus a device synchronize) with a wall clock, drops the warm-up steps and reports the
median. tokens/s = micro_batch * seq_len / step time; MFU = train_gpt's model FLOPs per token
(gpt_model.model_flops_per_token) * tokens/s / peak.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

from gpt_model import SIZES, model_flops_per_token

H100_SXM_BF16_DENSE_TFLOPS = 989.0  # NVIDIA's H100 SXM datasheet, bf16 dense (no sparsity)


def add_common_flags(p):
    p.add_argument("--size", choices=sorted(SIZES), help="a named size (sets the three below)")
    p.add_argument("--n_layer", type=int, default=24)
    p.add_argument("--n_embd", type=int, default=1024)
    p.add_argument("--n_head", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--micro_batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--peak_tflops", type=float,
                   default=float(os.environ.get("PEAK_TFLOPS", H100_SXM_BF16_DENSE_TFLOPS)))
    p.add_argument("--attention", choices=("auto", "manual", "sdpa"), default="auto",
                   help="auto (default): as ours, deepspeed::nn::causal_attention: fused "
                        "scaled_dot_product_attention on CUDA, written out elsewhere")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke tests)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--label", default="", help="name on the RESULT line")


def resolve_size(args):
    """Applies --size and resolves --attention auto."""
    if args.size:
        args.n_layer, args.n_embd, args.n_head = SIZES[args.size]
    if args.attention == "auto":
        fused = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        args.attention = "sdpa" if fused and args.device.startswith("cuda") else "manual"
    return args


def device_of(args):
    """--device as a torch.device; "cuda" gets its index (LOCAL_RANK, else 0), which
    torch.cuda.set_device needs. Fails when CUDA is asked for and absent."""
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail("--device cuda but torch.cuda.is_available() is False")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_device_bytes(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def random_batch(args, vocab, device, generator):
    # Uniform token ids: throughput does not depend on the text (ours reads the corpus).
    shape = (args.micro_batch, args.seq_len)
    idx = torch.randint(0, vocab, shape, device=device, generator=generator)
    targets = torch.randint(0, vocab, shape, device=device, generator=generator)
    return idx, targets


def timed_training(args, device, step_fn, batch_fn):
    """Runs warmup + steps optimizer steps; returns (per-step seconds of the timed ones, losses).
    step_fn(idx, targets) -> loss tensor (the whole optimizer step)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        idx, targets = batch_fn()
        synchronize(device)
        t0 = time.perf_counter()
        loss = step_fn(idx, targets)
        value = loss.item()  # a sync, as train_gpt's loss.item() in its step loop
        synchronize(device)
        secs = time.perf_counter() - t0
        losses.append(value)
        if step >= args.warmup:
            times.append(secs)
        print(f"step {step + 1} | loss {value:.4f} | step {secs:.4f} s"
              f"{' (warm-up)' if step < args.warmup else ''}", flush=True)
    return times, losses


def report(args, system, params, times, losses, device, extra=None):
    """Prints the human summary and one `RESULT {json}` line (bench.py reads it)."""
    tokens_per_step = args.micro_batch * args.seq_len
    median = statistics.median(times)
    tps = tokens_per_step / median
    flops = model_flops_per_token(params, args.n_layer, args.n_embd, args.seq_len)
    mfu = flops * tps / (args.peak_tflops * 1e12)
    row = {
        "label": args.label or system, "system": system, "params": params,
        "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
        "seq_len": args.seq_len, "micro_batch": args.micro_batch,
        "timed_steps": len(times), "warmup": args.warmup,
        "step_s_median": median, "step_s_min": min(times), "step_s_max": max(times),
        "tokens_per_s": tps, "mfu": mfu, "peak_tflops": args.peak_tflops,
        "model_flops_per_token": flops,
        "peak_device_bytes": peak_device_bytes(device),
        "first_loss": losses[0], "last_loss": losses[-1],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    row.update(extra or {})
    print(f"{row['label']}: {params / 1e6:.1f}M params | tokens/s {tps:.0f} (median of "
          f"{len(times)}, step {median:.4f} s) | MFU {100 * mfu:.2f}% of {args.peak_tflops:g} "
          f"TFLOP/s | peak device memory {row['peak_device_bytes'] / 2**30:.2f} GiB | loss "
          f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    print("RESULT " + json.dumps(row), flush=True)
    return row


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def parser(description):
    p = argparse.ArgumentParser(description=description)
    add_common_flags(p)
    return p

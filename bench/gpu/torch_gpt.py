#!/usr/bin/env python3
"""PyTorch peer of train_gpt on one GPU: the example GPT (gpt_model.py), bf16, AdamW(fused=True),
random tokens, no DeepSpeed. Prints a line per step and a RESULT line (peer_common.report).

    python3 bench/gpu/torch_gpt.py --size 350M --micro_batch 8 --steps 8 --warmup 3

--precision picks how bf16 is used:
  master   (default) the model in bf16, fp32 master weights updated by fused AdamW, each step's
           bf16 gradients copied into persistent fp32 ones first: the recipe of DeepSpeed's bf16
           optimizer and of ours (docs/precision.md), so the math per step is the same.
  autocast fp32 parameters, forward under torch.autocast(bfloat16): what a PyTorch user writes
           (softmax and the loss then run in fp32).
  bf16     everything in bf16, AdamW included (no master weights): a speed ceiling, not the same
           training.
AdamW: lr --lr, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, global-norm clipping at 1.0, as
examples/train_gpt/ds_config.json.
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from gpt_model import GPT2_VOCAB, GptModel  # noqa: E402
import peer_common  # noqa: E402

CLIP = 1.0


def build_model(args, device, dtype):
    # torch >= 2.0 builds the parameters on the device directly (no host copy of the model).
    where = device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with where:
        model = GptModel(args.n_layer, args.n_embd, args.n_head, args.seq_len,
                         attention=args.attention)
    return model.to(device=device, dtype=dtype)


def adamw(params, device, lr):
    # fused=True needs torch >= 2.0 and CUDA tensors; Debian's torch 1.13 (CPU smoke test) runs
    # the plain loop.
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)


def clip(params):
    try:
        torch.nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
    except TypeError:  # torch 1.13: no foreach argument
        torch.nn.utils.clip_grad_norm_(params, CLIP)


def copy_all(dst, src):
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


def master_weights_step(model, device, lr):
    """bf16 model, fp32 masters + fp32 gradients, AdamW on the masters, masters copied back."""
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone() for p in params]
    for m in masters:
        m.grad = torch.zeros_like(m)
    opt = adamw(masters, device, lr)

    def step(idx, targets):
        loss = model(idx, targets)
        loss.backward()
        copy_all([m.grad for m in masters], [p.grad for p in params])
        model.zero_grad(set_to_none=True)
        clip(masters)
        opt.step()
        with torch.no_grad():
            copy_all(params, masters)
        return loss

    return step


def plain_step(model, device, lr, autocast):
    opt = adamw(model.parameters(), device, lr)
    ctx = (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)) if autocast \
        else contextlib.nullcontext

    def step(idx, targets):
        with ctx():
            loss = model(idx, targets)
        loss.backward()
        clip(list(model.parameters()))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def main():
    p = peer_common.parser(__doc__.split("\n")[0])
    p.add_argument("--precision", choices=("master", "autocast", "bf16"), default="master")
    args = peer_common.resolve_size(p.parse_args())
    device = peer_common.device_of(args)
    torch.manual_seed(args.seed)
    dtype = torch.float32 if args.precision == "autocast" else torch.bfloat16
    model = build_model(args, device, dtype)
    params = model.num_parameters()
    if args.precision == "master":
        step = master_weights_step(model, device, args.lr)
    else:
        step = plain_step(model, device, args.lr, autocast=args.precision == "autocast")
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    print(f"torch_gpt: {params / 1e6:.1f}M params, n_layer {args.n_layer} n_embd {args.n_embd} "
          f"n_head {args.n_head}, seq {args.seq_len} x micro-batch {args.micro_batch}, "
          f"precision {args.precision}, attention {args.attention}, torch {torch.__version__} "
          f"on {device}", flush=True)
    times, losses = peer_common.timed_training(
        args, device, step, lambda: peer_common.random_batch(args, GPT2_VOCAB, device, gen))
    peer_common.report(args, "torch", params, times, losses, device,
                       {"precision": args.precision, "attention": args.attention})


if __name__ == "__main__":
    main()

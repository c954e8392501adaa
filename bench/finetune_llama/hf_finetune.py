"""The peer of bench/finetune_llama: the same fine-tuning with transformers + PyTorch DDP (Gloo).

Loads the same .gguf with transformers (dequantised to fp32 by gguf-py), tokenizes the corpus with
the tokenizer transformers builds from that file, and trains with AdamW (settings from the same
ds_config: lr, betas, eps, weight decay, clipping) on windows of --seq_len tokens, micro-batch from
the ds_config, one process per rank started by our launcher. Writes finetune_llama's metrics
lines (step, loss, tokens_per_s, step_time_s, peak_rss_bytes per rank). With --lora_r R, each
decoder projection gets LoRA adapters as finetune_llama's (frozen weight, A Kaiming-uniform, B
zeros, scaled by --lora_alpha / R), everything else frozen, DDP over the adapters alone.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import transformers.generation.utils as generation_utils

generation_utils.is_fsdp_managed_module = lambda module: False  # see tests/e2e/llama_reference.py
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from finetune_metrics import write_step  # noqa: E402  (bench/common)


class LoraLinear(torch.nn.Module):
    """y = x W^T + (alpha / r) B(A(x)) over a frozen Linear, as deepspeed.linear's."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_weight_1 = torch.nn.Linear(base.in_features, r, bias=False)
        self.lora_weight_2 = torch.nn.Linear(r, base.out_features, bias=False)
        torch.nn.init.zeros_(self.lora_weight_2.weight)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_weight_2(self.lora_weight_1(x)) * self.scaling


TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, r, alpha):
    model.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in TARGETS and isinstance(child, torch.nn.Linear):
                setattr(module, child_name, LoraLinear(child, r, alpha))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--metrics_file", default="")
    ap.add_argument("--local_rank", type=int, default=0)
    ap.add_argument("--lora_r", type=int, default=0)
    ap.add_argument("--lora_alpha", type=float, default=16.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = json.load(open(args.deepspeed_config))
    micro = cfg["train_micro_batch_size_per_gpu"]
    opt = cfg["optimizer"]["params"]

    folder, name = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    if args.lora_r > 0:
        add_lora(model, args.lora_r, args.lora_alpha)
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(trainable, lr=opt["lr"], betas=tuple(opt.get("betas", (0.9, 0.999))),
                              eps=opt.get("eps", 1e-8), weight_decay=opt.get("weight_decay", 0.0))
    ids = torch.tensor(tok(open(args.data, encoding="utf-8").read()).input_ids)
    n_windows = (len(ids) - 1) // args.seq_len
    out = open(args.metrics_file, "w") if rank == 0 and args.metrics_file else None
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        first = ((step - 1) * world * micro + rank * micro) % (n_windows - micro)
        batch = torch.stack([ids[(first + j) * args.seq_len:(first + j) * args.seq_len + args.seq_len + 1]
                             for j in range(micro)])
        logits = ddp(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.get("gradient_clipping", 0.0) or 1e9)
        optim.step()
        optim.zero_grad(set_to_none=True)
        secs = time.perf_counter() - t0
        write_step(out, step, loss.item(), secs, world * micro * args.seq_len)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The peers of token_choice_moe_bench: one Mixtral MoE block, forward + backward, in Python.
  transformers  transformers' MixtralSparseMoeBlock (4.47 in .venv over Debian's torch 1.13, the
                LibTorch build ours links; 5.x in .venv-deepspeed-torch2 over torch 2.11);
  deepspeed     DeepSpeed 0.19.8's AutoEPMoELayer: a one-layer MixtralForCausalLM of the same
                shape through deepspeed.initialize with expert_parallel (autoep_size 1, one
                process on Gloo), its replaced block timed alone (torch 2.11, transformers 5).
Prints "step_ms=<median> step_peak_mb=<resident peak of a step above the memory before it>
out=<sum of the output>", as token_choice_moe_bench does.
Usage: python_token_choice_moe.py transformers|deepspeed T H F E K fp32|bf16 ITERS
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from resident_peak import reset_resident_peak, status_mib  # noqa: E402


def mixtral_config(h, f, e, k):
    from transformers import MixtralConfig
    return MixtralConfig(vocab_size=128, hidden_size=h, intermediate_size=f, num_hidden_layers=1,
                         num_attention_heads=max(1, h // 64), num_key_value_heads=max(1, h // 64),
                         num_local_experts=e, num_experts_per_tok=k)


def transformers_block(cfg):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    block = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    return block


def deepspeed_block(cfg):
    import deepspeed
    from transformers import MixtralForCausalLM
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="gloo")
    model = MixtralForCausalLM(cfg)
    config = {"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
              "zero_optimization": {"stage": 0},
              "expert_parallel": {"enabled": True, "autoep_size": 1, "preset_model": "mixtral"}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    block = engine.module.model.layers[0].mlp
    assert type(block).__name__ == "AutoEPMoELayer", type(block).__name__
    return block


def main():
    form = sys.argv[1]
    t, h, f, e, k = (int(v) for v in sys.argv[2:7])
    dtype = torch.bfloat16 if sys.argv[7] == "bf16" else torch.float32
    iters = int(sys.argv[8])
    torch.manual_seed(0)
    cfg = mixtral_config(h, f, e, k)
    block = deepspeed_block(cfg) if form == "deepspeed" else transformers_block(cfg)
    block.to(dtype).train()
    x = torch.randn(1, t, h).to(dtype).requires_grad_()
    times, peak, out = [], 0.0, 0.0
    for i in range(iters + 1):  # the first is a warm-up
        x.grad = None
        block.zero_grad(set_to_none=True)
        before = status_mib("VmRSS")
        reset_resident_peak()
        start = time.perf_counter()
        y = block(x)
        y = y[0] if isinstance(y, tuple) else y
        y.sum().backward()
        stop = time.perf_counter()
        peak = max(peak, status_mib("VmHWM") - before)
        out = float(y.detach().sum())
        if i > 0:
            times.append((stop - start) * 1000.0)
    print(f"step_ms={statistics.median(times):.1f} step_peak_mb={peak:.0f} out={out:.6f}")


if __name__ == "__main__":
    main()

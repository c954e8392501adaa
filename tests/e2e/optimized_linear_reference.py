"""DeepSpeed's own LoRAOptimizedLinear (deepspeed.linear, DeepSpeed 0.19.8 on torch 2.11, CPU), as
the reference of optimized_linear_parity_test.

Reads IN (torch.save of a dict: weight [out, in], lora_weight_1.weight [r, in],
lora_weight_2.weight [out, r], x [n, in], grad [n, out], and lora_r, lora_alpha as 0-d tensors),
builds OptimizedLinear(in, out, lora_config=LoRAConfig(lora_r, lora_alpha), dtype=float32) on the
CPU, loads the weights through load_state_dict (as the q_proj of a parent module), runs
y = layer(x), backpropagates `grad`, and writes OUT: y, the gradients of x and of both adapters,
and the module's state-dict keys (as a 1-d uint8 tensor of their names joined by newlines).
Usage: optimized_linear_reference.py IN OUT
"""
import sys

import torch

from deepspeed.linear import LoRAConfig, OptimizedLinear


def main():
    inp = torch.load(sys.argv[1])
    out_dim, in_dim = inp["weight"].shape
    config = LoRAConfig(lora_r=int(inp["lora_r"]), lora_alpha=float(inp["lora_alpha"]))
    layer = OptimizedLinear(in_dim, out_dim, lora_config=config, dtype=torch.float32,
                            device="cpu")
    # Under a parent as "q_proj": DeepSpeed's _load_from_state_dict disables a module whose
    # state-dict prefix names none of LoRAConfig.target_mods (the bare module's is empty).
    parent = torch.nn.ModuleDict({"q_proj": layer})
    parent.load_state_dict({"q_proj." + k: inp[k] for k in
                            ("weight", "lora_weight_1.weight", "lora_weight_2.weight")})
    x = inp["x"].clone().requires_grad_(True)
    y = layer(x)
    y.backward(inp["grad"])
    keys = "\n".join(layer.state_dict().keys()).encode()
    torch.save({"y": y.detach(), "x_grad": x.grad,
                "lora_weight_1_grad": layer.lora_weight_1.weight.grad,
                "lora_weight_2_grad": layer.lora_weight_2.weight.grad,
                "weight_requires_grad": torch.tensor(layer.weight.requires_grad),
                "keys": torch.tensor(list(keys), dtype=torch.uint8)}, sys.argv[2])


if __name__ == "__main__":
    main()

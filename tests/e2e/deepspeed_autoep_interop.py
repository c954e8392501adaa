#!/usr/bin/env python3
"""DeepSpeed's side of deepspeed_autoep_interop_test (DeepSpeed 0.19.8, whose AutoEP trains at
ZeRO 0-3; the case's config says which). Reads WORK_DIR/case.json: the ds_config, the model's initial parameters (by name, whole)
and each step's batch of every rank. Run on the case's ranks (torch.distributed.run), it builds
tests/dist/auto_ep_dist_test.cpp's model:

    h = tanh(in(x));  y = out(moe(h));  loss = mse(y, target)
    moe: a gate Linear(8, 4, no bias) routing each token to 2 of 4 SwiGLU experts, stacked as
         experts.w1 [4, 12, 8], experts.w2 [4, 8, 12], experts.w3 [4, 12, 8]

whose block AutoEP finds by the section's patterns (router "gate", experts "experts", weights
w1/w2/w3) and replaces with its AutoEPMoELayer (the gate then named moe.router.gate.weight), then:

  train    from the initial parameters, steps 0 and 1, save_checkpoint(WORK_DIR/deepspeed, "two"),
           step 2;
  resume   load_checkpoint(WORK_DIR/ours, "two") (deepspeed-cpp's), step 2;
  universal with checkpoint.load_universal and autoep_size 4, load_checkpoint of
           WORK_DIR/ours_cpp_universal, "u" (deepspeed-cpp's ds_to_universal of its ZeRO-2
           checkpoint), step 2.

Each rank writes WORK_DIR/<mode>_<rank>.json: the losses of the steps it ran and, after the last,
the dense parameters gathered (our names) and its experts by global id.

usage: python -m torch.distributed.run --nproc_per_node N deepspeed_autoep_interop.py MODE WORK_DIR
"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
import deepspeed  # noqa: E402

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
from peer_exit import leave  # noqa: E402

HIDDEN, FFN, EXPERTS = 8, 12, 4


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.zeros(EXPERTS, FFN, HIDDEN))
        self.w2 = torch.nn.Parameter(torch.zeros(EXPERTS, HIDDEN, FFN))
        self.w3 = torch.nn.Parameter(torch.zeros(EXPERTS, FFN, HIDDEN))


class Block(torch.nn.Module):
    """The structure AutoEP replaces; it never runs itself."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = Experts()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("in", torch.nn.Linear(HIDDEN, HIDDEN))
        self.moe = Block()
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, target):
        h = torch.tanh(getattr(self, "in")(x))
        m = self.moe(h.unsqueeze(0))  # AutoEP's layer takes [batch, sequence, hidden]
        if isinstance(m, tuple):
            m = m[0]
        return torch.nn.functional.mse_loss(self.out(m.squeeze(0)), target)


def our_name(name):
    return name.replace("moe.router.gate.", "moe.gate.")


def main():
    mode, work = sys.argv[1], sys.argv[2]
    case = json.load(open(os.path.join(work, "case.json")))
    deepspeed.init_distributed("gloo")
    rank = torch.distributed.get_rank()
    model = Net()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(case["initial"][name]).view(p.shape))
    config = case["config"]
    if mode == "universal":  # our ds_to_universal's folder, onto one expert per rank
        config = dict(config, checkpoint={"load_universal": True},
                      expert_parallel=dict(config["expert_parallel"], autoep_size=4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    layer = engine.module.moe

    def step(s):
        x, target = case["batches"][s][rank]
        loss = engine(torch.tensor(x), torch.tensor(target))
        engine.backward(loss)
        engine.step()
        return loss.item()

    losses = {}
    if mode == "train":
        for s in (0, 1):
            losses[s] = step(s)
        engine.save_checkpoint(os.path.join(work, "deepspeed"), tag="two")
    elif mode == "universal":
        engine.load_checkpoint(os.path.join(work, "ours_cpp_universal"), tag="u",
                               load_module_strict=False)
    else:
        engine.load_checkpoint(os.path.join(work, "ours"), tag="two", load_module_strict=False)
    losses[2] = step(2)

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        dense = {our_name(n): p.detach().flatten().tolist()
                 for n, p in engine.module.named_parameters() if ".experts." not in n}
        experts = {}
        for i in range(layer.num_local_experts):
            weights = (layer.experts.w1, layer.experts.w2, layer.experts.w3)
            experts[str(layer.ep_rank * layer.num_local_experts + i)] = [
                w[i].detach().flatten().tolist() for w in weights]
    out = {"losses": {str(s): v for s, v in losses.items()}, "dense": dense, "experts": experts}
    with open(os.path.join(work, f"{mode}_{rank}.json"), "w") as f:
        json.dump(out, f)
    leave()


if __name__ == "__main__":
    main()

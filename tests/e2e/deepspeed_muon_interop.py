#!/usr/bin/env python3
"""DeepSpeed's side of deepspeed_muon_interop_test (DeepSpeed 0.19.8, which has the Muon
optimizer; 0.15.4 has not). Reads WORK_DIR/cases.json: the model's initial parameters (by name),
the token batches and, per case, a ds_config; trains the same model under deepspeed.initialize
on one process for every case and writes the final parameters to WORK_DIR/deepspeed.json.

Two things are pinned so that the comparison does not depend on the CPU, by
bench/common/deepspeed_muon_cpu.py: Newton-Schulz runs in fp32, and the Adam half is
MuonWithAuxAdam's inline Adam.

usage: deepspeed_muon_interop.py WORK_DIR"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                   ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(key, value)

import torch  # noqa: E402
import deepspeed  # noqa: E402

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
from peer_exit import leave  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                                "common"))
from deepspeed_muon_cpu import pin_muon  # noqa: E402

VOCAB = 16
pin_muon(torch)


class MuonNet(torch.nn.Module):
    """tests/dist/muon_dist_test.cpp's MuonNet, parameter for parameter."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.c_fc = torch.nn.Linear(8, 20)
        self.c_proj = torch.nn.Linear(20, 8)
        self.mix = torch.nn.Linear(8, 8, bias=False)
        self.lm_head = torch.nn.Linear(8, VOCAB)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        h = torch.tanh(self.c_fc(x))
        y = x + self.c_proj(h) + 0.5 * self.mix(x)
        logits = self.lm_head(y).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main():
    work = sys.argv[1]
    cases = json.load(open(f"{work}/cases.json"))
    results = []
    os.environ["MASTER_PORT"] = str(cases["port"])
    for case in cases["cases"]:
        model = MuonNet()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.tensor(cases["initial"][name]).view(p.shape))
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=case)
        for step in cases["batches"]:
            for tokens, targets in step:
                loss = engine(torch.tensor(tokens), torch.tensor(targets))
                engine.backward(loss)
                engine.step()
        # ZeRO-3 partitions the parameters: gather them to read them.
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=case["zero_optimization"]["stage"] == 3):
            results.append({name: p.detach().float().flatten().tolist()
                            for name, p in engine.module.named_parameters()})
        if hasattr(engine, "destroy"):
            engine.destroy()
    with open(f"{work}/deepspeed.json", "w") as f:
        json.dump({"params": results}, f)
    leave()


if __name__ == "__main__":
    main()

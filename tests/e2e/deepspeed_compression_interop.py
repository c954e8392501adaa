"""DeepSpeed Compression's run of deepspeed_compression_interop_test.

Usage: deepspeed_compression_interop.py CONFIG.json OUT.pt [mlp|cnn]

Builds the test's small network (mlp: an embedding, four attention projections, a two-layer MLP;
cnn: two convolutions with a BatchNorm2d between them and a linear head) from seed 7, runs
DeepSpeed's init_compression with CONFIG, trains 6 SGD steps with DeepSpeed's compression
scheduler stepped as its engine steps it, then runs redundancy_clean, and saves every
intermediate the C++ side compares against.
"""
import json
import sys

import torch
from torch import nn

from deepspeed.compression.compress import init_compression, redundancy_clean
from deepspeed.compression.config import get_compression_config
from deepspeed.compression.scheduler import compression_scheduler

STEPS = 6


class Attention(nn.Module):

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)
        self.o = nn.Linear(8, 8)


class Mlp(nn.Module):

    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(8, 16)
        self.c_proj = nn.Linear(16, 8)


class Net(nn.Module):

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.attn = Attention()
        self.mlp = Mlp()

    def forward(self, idx):
        x = self.emb(idx)
        a = self.attn.q(x) * torch.sigmoid(self.attn.k(x)) + self.attn.v(x)
        x = x + self.attn.o(a)
        return x + self.mlp.c_proj(torch.relu(self.mlp.c_fc(x)))


class Cnn(nn.Module):

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.relu(self.conv2(x)).mean((2, 3)))


def main():
    config_path, out_path = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "mlp"
    with open(config_path) as f:
        config = json.load(f)
    torch.manual_seed(7)
    if kind == "cnn":
        model = Cnn()
        idx = torch.randn(4, 3, 6, 6)
        target = torch.randn(4, 4)
    else:
        model = Net()
        idx = torch.randint(0, 16, (4, 6))
        target = torch.randn(4, 6, 8)
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    model = init_compression(model, json.loads(json.dumps(config)))
    after_init = {k: v.clone() for k, v in model.state_dict().items()}

    scheduler = compression_scheduler(model, get_compression_config(json.loads(json.dumps(config))))
    # DeepSpeed's scheduler reads schedule_offset_end for every sparse pruning method but its
    # config reader keeps it for snip_momentum only (a KeyError otherwise): supply it as given.
    sparse = config["compression_training"].get("sparse_pruning", {}).get("shared_parameters", {})
    shared = scheduler.different_compression_methods["sparse_pruning"]["shared_parameters"]
    shared["schedule_offset_end"] = sparse.get("schedule_offset_end", shared["schedule_offset"])

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        if step == 0:
            scheduler.step(step_zero_check=True)  # the engine's forward at global step 0
        loss = ((model(idx) - target)**2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.detach().clone())

    model.eval()
    with torch.no_grad():
        trained_out = model(idx)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    redundancy_clean(model, json.loads(json.dumps(config)))
    with torch.no_grad():
        cleaned_out = model(idx)
    torch.save(
        {
            "idx": idx,
            "target": target,
            "initial": initial,
            "after_init": after_init,
            "losses": torch.stack(losses),
            "trained": trained,
            "trained_out": trained_out,
            "cleaned": {k: v.clone() for k, v in model.state_dict().items()},
            "cleaned_out": cleaned_out,
        }, out_path)


if __name__ == "__main__":
    main()

"""DeepSpeed's side of bench/compression: the same steps with LinearLayer_Compress.

Usage: deepspeed_compression.py plain|compressed CONFIG STEPS [D L TOKENS]
"""
import json
import statistics
import sys
import time

import torch
from torch import nn

from deepspeed.compression.compress import init_compression
from deepspeed.compression.config import get_compression_config
from deepspeed.compression.scheduler import compression_scheduler


class Block(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.c_proj(nn.functional.gelu(self.c_fc(x)))


def main():
    mode, config_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    d = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    layers = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 1024
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(d) for _ in range(layers)])
    scheduler = None
    if mode == "compressed":
        with open(config_path) as f:
            config = json.load(f)
        model = init_compression(model, json.loads(json.dumps(config)))
        scheduler = compression_scheduler(model, get_compression_config(config))
        scheduler.step(step_zero_check=True)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(tokens // 64, 64, d)
    y = torch.randn(tokens // 64, 64, d)
    ms = []
    loss = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        out = ((model(x) - y)**2).mean()
        out.backward()
        sgd.step()
        sgd.zero_grad()
        if scheduler is not None:
            scheduler.step()
        ms.append((time.perf_counter() - t0) * 1e3)
        loss = out.item()
    print(f"step_ms={statistics.median(ms[1:]):.3f} loss={loss:.6f}")


if __name__ == "__main__":
    main()

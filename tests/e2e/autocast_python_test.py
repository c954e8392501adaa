"""PyTorch's own AMP for autocast_python_test.cpp: the same small network, weights and batches,
trained with torch.autocast("cpu", bfloat16) and SGD, one micro-batch per step. (On one rank
DeepSpeed's reduction of the Linear gradients in bf16 changes nothing: autocast's backward
already made them bf16 values.) Prints {"losses": [...], "params": {name: [...]}}."""
import argparse
import json

import torch
import torch.nn.functional as F


class AmpNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        # Not a lower-precision-safe module's: reduced in fp32. (LayerNorm would do, but
        # LibTorch 1.13's CPU layer_norm refuses bf16 inputs with fp32 weights under autocast.)
        self.gain = torch.nn.Parameter(torch.ones(32))
        self.fc2 = torch.nn.Linear(32, 8)
        with torch.no_grad():
            for k, p in enumerate(self.parameters()):
                p.copy_((torch.sin(torch.arange(p.numel(), dtype=torch.float) * 0.37 + k) * 0.3)
                        .reshape(p.shape))

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x)) * self.gain), y)


def batch(step):
    x = torch.sin(torch.arange(4 * 16, dtype=torch.float) * 0.11 + step * 0.7).reshape(4, 16)
    y = torch.cos(torch.arange(4 * 8, dtype=torch.float) * 0.23 + step).reshape(4, 8) * 0.5
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = AmpNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, y = batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    print(json.dumps({"losses": losses,
                      "params": {n: p.detach().reshape(-1).tolist()
                                 for n, p in model.named_parameters()}}))


if __name__ == "__main__":
    main()

"""finetune_llama's metrics line, for the Python peers of its benches (bench/finetune_llama,
bench/auto_ep): every rank's loss and peak RSS gathered to all; rank 0 (the one with `out`)
writes the step, the loss summed over the ranks (each rank's mean divided by the world size),
tokens/s, the step time and the per-rank peaks, and prints a progress line."""
import json
import resource

import torch
import torch.distributed as dist


def write_step(out, step, loss, secs, tokens):
    """`loss`: this rank's mean loss; `tokens`: the step's tokens over every rank."""
    world = dist.get_world_size()
    stats = torch.tensor([loss / world,
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0],
                         dtype=torch.float64)
    peaks = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(peaks, stats)
    if not out:
        return
    row = {"step": step, "loss": sum(p[0].item() for p in peaks), "tokens_per_s": tokens / secs,
           "step_time_s": secs, "peak_rss_bytes": [int(p[1].item()) for p in peaks]}
    out.write(json.dumps(row) + "\n")
    out.flush()
    print(f"step {step} | loss {row['loss']:.4f} | tokens/s {row['tokens_per_s']:.0f}", flush=True)

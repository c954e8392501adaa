"""DeepSpeed 0.19.8's side of bench/auto_ep: the Qwen3-MoE folder loaded by transformers 5,
handed to deepspeed.initialize with the same ds_config as finetune_llama (its expert_parallel
section: AutoEP replaces each sparse block by its AutoEPMoELayer, preset "qwen3_moe"), trained on
the corpus as finetune_llama trains it: windows of --seq_len + 1 tokens, micro-batch from the
config, rank r's windows after rank r - 1's. Writes finetune_llama's metrics lines (step, loss,
tokens_per_s, step_time_s, peak_rss_bytes per rank). One process per rank through
torch.distributed.run (.venv-deepspeed-torch2).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from finetune_metrics import write_step  # noqa: E402  (bench/common)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--metrics_file", default="")
    args = ap.parse_args()

    deepspeed.init_distributed("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = json.load(open(args.deepspeed_config))
    micro = cfg["train_micro_batch_size_per_gpu"]
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.train()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    # AutoEP replaced every sparse block (else the comparison would be with plain experts).
    sharded = sum(type(m).__name__ == "AutoEPMoELayer" for m in engine.module.modules())
    if rank == 0:
        print(f"deepspeed: {sharded} AutoEPMoELayer blocks", flush=True)
    ids = torch.tensor(tok(open(args.data, encoding="utf-8").read()).input_ids)
    n_windows = (len(ids) - 1) // args.seq_len
    out = open(args.metrics_file, "w") if rank == 0 and args.metrics_file else None
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        first = ((step - 1) * world * micro + rank * micro) % (n_windows - micro)
        batch = torch.stack([ids[(first + j) * args.seq_len:(first + j + 1) * args.seq_len + 1]
                             for j in range(micro)])
        logits = engine(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 batch[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        secs = time.perf_counter() - t0
        write_step(out, step, loss.item(), secs, world * micro * args.seq_len)


if __name__ == "__main__":
    main()

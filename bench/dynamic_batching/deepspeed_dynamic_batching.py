#!/usr/bin/env python3
"""DeepSpeed's side of bench/dynamic_batching: its batch_by_seqlens on the same input as
dynamic_batching_bench.cpp. Prints `pack_s=.. batches=.. checksum=..`.

usage: deepspeed_dynamic_batching.py N MAX_TOKENS ORDER"""
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import (  # noqa
    batch_by_seqlens)


def main():
    n, max_tokens, order = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    seqlens = [(i * 7919) % 59 + 1 for i in range(n)]
    t0 = time.perf_counter()
    ids, sizes, _ = batch_by_seqlens(seqlens, max_tokens=max_tokens, effective_batch_size=8,
                                     sequence_picking_order=order, seed=1)
    seconds = time.perf_counter() - t0
    checksum = 0
    for batch, mb in ids:
        checksum = (checksum * 1000003 + int(batch)) % 2**64
        for s in mb:
            checksum = (checksum * 1000003 + int(s)) % 2**64
    print(f"pack_s={seconds:.6f} batches={len(sizes)} checksum={checksum}")


if __name__ == "__main__":
    main()

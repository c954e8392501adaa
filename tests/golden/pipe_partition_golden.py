#!/usr/bin/env python3
"""Prints DeepSpeed's partition_uniform / partition_balanced results that
tests/unit/pipe/partition_test.cpp embeds. Needs `deepspeed` importable (its runtime/utils.py);
the committed values came from deepspeedai/DeepSpeed edaa7221 (the dynamic-program
partition_balanced)."""
from deepspeed.runtime.utils import partition_balanced, partition_uniform

for n, p in [(10, 4), (3, 4), (8, 2), (7, 3)]:
    print(f"uniform n={n} p={p}", partition_uniform(n, p))
for w, p in [([1] * 8, 2), ([100, 10, 10, 10, 10, 100], 2), ([100, 10, 10, 10, 10, 100], 3),
             ([5, 1, 1, 1, 1, 1, 1, 5], 4), ([0, 1, 1, 1, 1, 0], 2), ([0, 1, 1, 1, 1, 1, 0], 2),
             ([3, 3, 3], 4), ([4160, 2112, 2112, 2112, 2112, 64, 0], 2),
             ([4160, 2112, 2112, 2112, 2112, 64, 0], 4), ([0, 1, 1, 1, 1, 0, 0], 2),
             ([0, 1, 1, 1, 1, 0, 0], 4), ([0, 1, 1, 1, 1, 0, 0], 3)]:
    print(f"balanced w={w} p={p}", partition_balanced(w, p))

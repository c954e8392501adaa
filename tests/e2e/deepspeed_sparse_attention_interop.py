"""DeepSpeed's side of deepspeed_sparse_attention_interop_test.

Usage: deepspeed_sparse_attention_interop.py CASES.json OUT.json

Each case gives a sparse_attention section, a head count, a sequence length and a seed. For
each, DeepSpeed's config reader (runtime/config.py get_sparse_attention) reads the section, and
the SparsityConfig class of its mode, built from what the reader returns (plus the case's
"class_extra" keyword arguments, which the reader drops, or, for "local", the section itself:
DeepSpeed's reader has no local mode), makes the layout after random.seed(seed). OUT gets the
reader's dict and the layout of each case.
"""
import json
import random
import sys

from deepspeed.ops.sparse_attention.sparsity_config import (
    BigBirdSparsityConfig, BSLongformerSparsityConfig, DenseSparsityConfig, FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig, VariableSparsityConfig)
from deepspeed.runtime.config import get_sparse_attention

CLASSES = {
    "dense": DenseSparsityConfig,
    "fixed": FixedSparsityConfig,
    "variable": VariableSparsityConfig,
    "bigbird": BigBirdSparsityConfig,
    "bslongformer": BSLongformerSparsityConfig,
}


def layout_of(case):
    random.seed(case["seed"])
    if case.get("local"):
        config = LocalSlidingWindowSparsityConfig(num_heads=case["heads"], **case["section"])
        return None, config.make_layout(case["seq_len"])
    read = get_sparse_attention({"sparse_attention": case["section"]})
    kwargs = {k: v for k, v in read.items() if k != "mode"}
    kwargs.update(case.get("class_extra", {}))
    config = CLASSES[read["mode"]](num_heads=case["heads"], **kwargs)
    return read, config.make_layout(case["seq_len"])


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for case in cases:
        read, layout = layout_of(case)
        out.append({"read": read, "layout": layout.tolist()})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()

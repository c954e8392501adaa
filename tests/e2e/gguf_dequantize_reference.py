"""Writes a GGUF file of random tensors in every block format finetune_llama decodes, each
followed by gguf-py's dequantization of it as an F32 tensor '<name>.expected'.

The quantized bytes are random, except the fp16 scales, which are set to finite values (a random
fp16 could be an infinity or a NaN). Usage: gguf_dequantize_reference.py OUT.gguf
"""
import sys

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

# Byte offsets of each format's fp16 scales within a block (ggml-common.h's block structs).
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.IQ4_NL: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_XS: [0],
}
ROWS, COLS = 6, 1024


def quantized(rng, qtype):
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = ROWS * COLS // block_values
    raw = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        # Scales of either sign over a few binades, as real files have; some zero.
        scale = (rng.standard_normal(blocks) * 2.0 ** rng.integers(-12, 2, blocks)).astype(np.float16)
        scale[rng.random(blocks) < 0.02] = 0
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(ROWS, COLS // block_values * block_bytes)


def main():
    rng = np.random.default_rng(20261206)
    writer = GGUFWriter(sys.argv[1], "llama")
    for qtype in FP16_FIELDS:
        raw = quantized(rng, qtype)
        writer.add_tensor(qtype.name, raw, raw_dtype=qtype)
        writer.add_tensor(qtype.name + ".expected", dequantize(raw, qtype).astype(np.float32))
    wide = (rng.standard_normal((ROWS, COLS)) * 100).astype(np.float32)
    bf16 = (wide.view(np.uint32) >> 16).astype(np.uint16)
    writer.add_tensor("BF16", bf16.view(np.uint8).reshape(ROWS, COLS * 2), raw_dtype=T.BF16)
    writer.add_tensor("BF16.expected", (bf16.astype(np.uint32) << 16).view(np.float32))
    writer.add_tensor("F16", wide.astype(np.float16))
    writer.add_tensor("F16.expected", wide.astype(np.float16).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()

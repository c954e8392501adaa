"""transformers' Llama with each rope_scaling type finetune_llama implements (and Phi-3 with
longrope), as the reference of rope_scaling_parity_test.

For each case writes OUT/<case>/: the model as a Hugging Face folder (random weights, saved by
save_pretrained), inv_freq.bin (the rotary embedding's fp32 frequencies), logits.bin (fp32
[T, vocab] of ids), logits_short.bin (of the first SHORT ids, the forward after) and meta.json
(ids, attention_scaling, the logits' shapes). Positions run past the shortest wavelengths so
that every branch of each scaling shows in the logits; dynamic's context is 256, so the first
forward stretches its frequencies and the second puts them back. longrope's original context is
128 positions: the first forward takes the long factors, the second the short ones.
Produced with transformers 4.47.1 on torch 1.13 (scripts/setup_python_refs.sh); with
--transformers5, the CASES5 (yarn's later keys, which 4.47 ignores or refuses) with transformers
5.15.1 on torch 2.11 (scripts/setup_deepspeed_peer.sh --torch2).
Usage: rope_scaling_reference.py OUT [--transformers5]
"""
import json
import os
import sys

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

CASES = {
    # The older spelling "type" for rope_type.
    "linear": dict(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.5}),
    # Head size 32, wavelengths 6, 14, 33, 75, 172, 393, 860, 1880 on: three kept, four blended,
    # the rest divided by the factor.
    "llama3": dict(rope_theta=500000.0, num_attention_heads=2, num_key_value_heads=1,
                   rope_scaling={"rope_type": "llama3", "factor": 6.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 16.0, "original_max_position_embeddings": 1024}),
    "yarn": dict(rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "dynamic": dict(rope_theta=10000.0, max_position_embeddings=256,
                    rope_scaling={"rope_type": "dynamic", "factor": 3.0}),
    "yarn_tuned": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 3.0, "attention_factor": 1.2, "beta_fast": 16.0,
        "beta_slow": 2.0}),
    # Phi-3's: Phi3Config 4.47 takes exactly type, short_factor and long_factor (head size 16).
    "longrope": dict(rope_theta=10000.0, original_max_position_embeddings=128, pad_token_id=None,
                     rope_scaling={"type": "longrope",
                                   "short_factor": [1.0 + 0.07 * i for i in range(8)],
                                   "long_factor": [1.0 + 0.5 * i * i for i in range(8)]}),
}
# transformers 5 reads yarn's correction range over original_max_position_embeddings (4.47
# takes max_position_embeddings), the attention factor mscale(f, mscale) / mscale(f, all_dim)
# (DeepSeek's) and truncate false (gpt-oss': the range unrounded).
CASES5 = {
    "yarn_original": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}),
    "yarn_mscale": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 3.0, "mscale": 1.0, "mscale_all_dim": 0.8,
        "truncate": False, "beta_fast": 16.0, "original_max_position_embeddings": 700}),
}
SEQ, SHORT = 300, 100


def main():
    out = sys.argv[1]
    cases = CASES5 if "--transformers5" in sys.argv[2:] else CASES
    for i, (name, kwargs) in enumerate(cases.items()):
        shape = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
        shape.update(kwargs)
        phi3 = name == "longrope"
        config = (Phi3Config if phi3 else LlamaConfig)(
            vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            tie_word_embeddings=False, attn_implementation="eager", **shape)
        torch.manual_seed(1000 + i)
        model = (Phi3ForCausalLM if phi3 else LlamaForCausalLM)(config).eval()
        folder = os.path.join(out, name)
        model.save_pretrained(folder, safe_serialization=True)
        ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            logits = model(ids).logits[0].float().contiguous()
            short = model(ids[:, :SHORT]).logits[0].float().contiguous()
        if phi3:  # a rotary embedding per layer, no attention_scaling attribute
            rotary = model.model.layers[0].self_attn.rotary_emb
            stretch = config.max_position_embeddings / config.original_max_position_embeddings
            rotary.attention_scaling = math.sqrt(
                1 + math.log(stretch) / math.log(config.original_max_position_embeddings))
        else:
            rotary = model.model.rotary_emb
        rotary.inv_freq.float().contiguous().numpy().tofile(os.path.join(folder, "inv_freq.bin"))
        logits.numpy().tofile(os.path.join(folder, "logits.bin"))
        short.numpy().tofile(os.path.join(folder, "logits_short.bin"))
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"ids": ids[0].tolist(), "attention_scaling": rotary.attention_scaling,
                       "shape": list(logits.shape), "short_shape": list(short.shape)}, f)


if __name__ == "__main__":
    main()

"""A random Qwen3-MoE folder for bench/auto_ep (transformers 5, whose fused expert layout
DeepSpeed 0.19.8's AutoEP preset "qwen3_moe" replaces): every layer sparse, E experts of width
MOE_FFN, top-2, renormalised, with the byte-level Qwen2 tokenizer of
tests/e2e/tokenizer_pretokenizers_reference.py trained on the corpus.
Usage: make_qwen3_moe.py CORPUS OUT HIDDEN LAYERS EXPERTS MOE_FFN
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "e2e"))

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizer_pretokenizers_reference import QWEN2_SPECIALS, qwen2  # noqa: E402


def main():
    corpus, out = sys.argv[1:3]
    hidden, layers, experts, moe_ffn = (int(v) for v in sys.argv[3:7])
    torch.manual_seed(20261207)
    tok = qwen2(corpus)
    ids = {t: tok.token_to_id(t) for t in QWEN2_SPECIALS}
    config = transformers.Qwen3MoeConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128,
        head_dim=64, max_position_embeddings=1024, num_experts=experts, num_experts_per_tok=2,
        moe_intermediate_size=moe_ffn, norm_topk_prob=True, mlp_only_layers=[],
        tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"], rope_theta=1e6)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2TokenizerFast", "bos_token": None,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
                   "add_prefix_space": False, "model_max_length": 1024,
                   "clean_up_tokenization_spaces": False}, f)


if __name__ == "__main__":
    main()

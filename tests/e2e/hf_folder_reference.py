"""A Hugging Face folder shaped as Llama 2's or Mistral's, for finetune_llama's parity tests: a
small random LlamaForCausalLM, or with KIND "mistral" a MistralForCausalLM whose sliding window
(12 positions) is far shorter than the sequences the tests run (saved by save_pretrained), with a
SentencePiece-style tokenizer.json, the "llama2" case of tokenizer_sentencepiece_reference.py
(trained on CORPUS), and a tokenizer_config.json naming LlamaTokenizerFast as both models' do.
Usage: llama2_folder_reference.py CORPUS OUT [KIND]
Produced with transformers 4.47.1, tokenizers 0.21, torch 1.13 (scripts/setup_python_refs.sh).
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_sentencepiece_reference import llama2_tokenizer  # noqa: E402


def main():
    corpus, out = sys.argv[1:3]
    kind = sys.argv[3] if len(sys.argv) > 3 else "llama2"
    tok = llama2_tokenizer(corpus)
    torch.manual_seed(20261206)
    sizes = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=False)
    if kind == "mistral":
        model = MistralForCausalLM(MistralConfig(sliding_window=12, **sizes))
    else:
        model = LlamaForCausalLM(LlamaConfig(**sizes))
    model.save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                   "add_eos_token": False, "legacy": True, "model_max_length": 256,
                   "clean_up_tokenization_spaces": False}, f)


if __name__ == "__main__":
    main()

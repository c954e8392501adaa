"""A Hugging Face folder shaped as Llama 2's, Mistral's or Qwen2's, for finetune_llama's parity
tests, saved by save_pretrained:
  llama2:  a small random LlamaForCausalLM with a SentencePiece-style tokenizer.json, the
           "llama2" case of tokenizer_sentencepiece_reference.py (trained on CORPUS), and a
           tokenizer_config.json naming LlamaTokenizerFast as the real model's does;
  mistral: the same as a MistralForCausalLM whose sliding window (12 positions) is far shorter
           than the sequences the tests run;
  mixtral: the same as a MixtralForCausalLM: 4 experts per layer, 2 per token, the routers'
           weights scaled up so that no token's choice of experts hangs on a rounding, the
           experts' so that their outputs weigh in the logits;
  qwen2:   a Qwen2ForCausalLM (random q/k/v biases: transformers would start them at zero) with
           the byte-level "qwen2" tokenizer of tokenizer_pretokenizers_reference.py (NFC, Qwen2's
           pattern) and Qwen2TokenizerFast's tokenizer_config.json. With GGUF, the same model and
           vocabulary are also written there as llama.cpp lays out a "qwen2" GGUF (f32 tensors);
  qwen3:   a Qwen3ForCausalLM (head_dim 32 with 4 heads of a 64-wide model, the q/k norms'
           weights random: transformers would start them at one) with Qwen2's tokenizer;
  qwen3_moe: the same as a Qwen3MoeForCausalLM: 4 experts of width 48 per sparse layer, 2 per
           token, norm_topk_prob true, layer 1 dense (mlp_only_layers), router and experts
           scaled up as Mixtral's.
Usage: hf_folder_reference.py CORPUS OUT [KIND [GGUF]]
       (KIND: llama2, mistral, mixtral, qwen2, qwen3, qwen3_moe)
Produced with transformers 4.47.1, tokenizers 0.21, gguf 0.10.0, torch 1.13
(scripts/setup_python_refs.sh); qwen3 and qwen3_moe, which transformers 4.47 lacks, with
transformers 5.15.1 and torch 2.11 (scripts/setup_deepspeed_peer.sh --torch2).
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_pretokenizers_reference import QWEN2_SPECIALS, qwen2  # noqa: E402
from tokenizer_sentencepiece_reference import llama2_tokenizer  # noqa: E402

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


def write_qwen2_gguf(model, tok, path):
    """The model as convert_hf_to_gguf.py writes a Qwen2 (no q/k row permutation)."""
    from gguf import GGUFWriter
    c = model.config
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w = GGUFWriter(path, "qwen2")
    w.add_name("qwen2-test")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in QWEN2_SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    w.add_pad_token_id(c.bos_token_id)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in model.state_dict().items():
        if name not in names:
            _, _, i, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            names[name] = f"blk.{i}.{layer[module]}.{kind}"
        w.add_tensor(names[name], t.detach().float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3_model(kind, tok_ids):
    """A Qwen3 or Qwen3-MoE (transformers >= 4.51) whose q/k norms and experts weigh in."""
    sizes = dict(SIZES, head_dim=32, vocab_size=tok_ids["vocab_size"],
                 bos_token_id=tok_ids["<|endoftext|>"],
                 eos_token_id=tok_ids["<|im_end|>"], rope_theta=1e6)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**sizes))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
            mlp_only_layers=[1], **sizes))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
            if kind == "qwen3_moe" and hasattr(layer.mlp, "experts"):
                layer.mlp.gate.weight.normal_(0.0, 0.2)
                for p in layer.mlp.experts.parameters():
                    p.normal_(0.0, 0.15)
    return model


def main():
    corpus, out = sys.argv[1:3]
    kind = sys.argv[3] if len(sys.argv) > 3 else "llama2"
    torch.manual_seed(20261206)
    if kind in ("qwen2", "qwen3", "qwen3_moe"):
        tok = qwen2(corpus)
        ids = {t: tok.token_to_id(t) for t in QWEN2_SPECIALS}
        if kind == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(
                vocab_size=tok.get_vocab_size(), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], **SIZES))
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                 layer.self_attn.v_proj):
                        proj.bias.normal_(0.0, 0.5)
        else:
            model = qwen3_model(kind, dict(ids, vocab_size=tok.get_vocab_size()))
        config = {"tokenizer_class": "Qwen2TokenizerFast", "bos_token": None,
                  "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
                  "add_prefix_space": False, "model_max_length": 256,
                  "clean_up_tokenization_spaces": False}
    else:
        tok = llama2_tokenizer(corpus)
        sizes = dict(vocab_size=tok.get_vocab_size(), bos_token_id=1, eos_token_id=2, **SIZES)
        if kind == "mistral":
            model = MistralForCausalLM(MistralConfig(sliding_window=12, **sizes))
        elif kind == "mixtral":
            model = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                     **sizes))
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.block_sparse_moe.gate.weight.normal_(0.0, 0.2)
                    for p in layer.block_sparse_moe.experts.parameters():
                        p.normal_(0.0, 0.15)
        else:
            model = LlamaForCausalLM(LlamaConfig(**sizes))
        config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>",
                  "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                  "add_eos_token": False, "legacy": True, "model_max_length": 256,
                  "clean_up_tokenization_spaces": False}
    model.save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if len(sys.argv) > 4:
        write_qwen2_gguf(model, tok, sys.argv[4])


if __name__ == "__main__":
    main()

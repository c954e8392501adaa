"""A Hugging Face folder shaped as Llama 2's, Mistral's, Mixtral's, Qwen2's, Qwen2-MoE's, Qwen3's
or Qwen3-MoE's, for finetune_llama's parity tests, saved by save_pretrained:
  llama2:  a small random LlamaForCausalLM with a SentencePiece-style tokenizer.json, the
           "llama2" case of tokenizer_sentencepiece_reference.py (trained on CORPUS), and a
           tokenizer_config.json naming LlamaTokenizerFast as the real model's does;
  mistral: the same as a MistralForCausalLM whose sliding window (12 positions) is far shorter
           than the sequences the tests run;
  gemma:   a GemmaForCausalLM (gemma_model: embeddings scaled by sqrt(hidden_size), RMSNorm
           offsets from one, GeGLU) with the llama2 vocabulary tokenized as Gemma's
           tokenizer.json does;
  gemma2:  the same as a Gemma2ForCausalLM (its extra norms, window on every other layer and
           soft caps);
  gemma3:  the same as a Gemma3ForCausalLM (q/k norms, a sliding and a global layer, each with
           its rotation);
  mistral_nemo: a MistralForCausalLM as Mistral NeMo's: heads of 32 features on a 64-wide model
           with 4 heads (head_dim, not hidden_size / heads), no sliding window, rotary base 1e6,
           and a byte-level tokenizer on Mistral's Tekken pattern (the "tekken" one of
           tokenizer_pretokenizers_reference.py);
  mixtral: the same as a MixtralForCausalLM: 4 experts per layer, 2 per token, the routers'
           weights scaled up so that no token's choice of experts hangs on a rounding, the
           experts' so that their outputs weigh in the logits; output_router_logits with a
           router_aux_loss_coef of 0.5, so that the load-balancing loss weighs in the score;
  phi3:    the same as a Phi3ForCausalLM (q/k/v and gate/up fused in its files) with longrope
           scaling: random short and long factors, an original context of 16 positions, which
           the 64 scored tokens pass and the generation crosses (the long factors take over);
  phi4_mini: the same Phi-3 rotating 3/4 of each head (partial_rotary_factor, transformers 5)
           with a byte-level tokenizer on GPT-4o's split pattern (the "o200k" one of
           tokenizer_pretokenizers_reference.py, as Phi-4-mini's), its original context 48
           positions: the score passes it, the generation stays within it (transformers 5.15's
           generation past it differs from its own full forward);
  qwen2:   a Qwen2ForCausalLM (random q/k/v biases: transformers would start them at zero) with
           the byte-level "qwen2" tokenizer of tokenizer_pretokenizers_reference.py (NFC, Qwen2's
           pattern) and Qwen2TokenizerFast's tokenizer_config.json;
  qwen2_moe: the same as a Qwen2MoeForCausalLM (qwen2_moe_model; with GGUF: Qwen2MoeConfig's
           widths, 1408 and 5632, no dense layer, no load-balancing loss, as transformers' GGUF
           loader takes them);
  deepseek_v2, deepseek_v3: a DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (deepseek_model:
           latent attention, yarn, a dense and a sparse layer with shared experts and
           group-limited routing) with the llama2 tokenizer;
  qwen3:   a Qwen3ForCausalLM (head_dim 128 with 4 heads of a 64-wide model, the q/k norms'
           weights random: transformers would start them at one) with Qwen2's tokenizer;
  qwen3_moe: the same as a Qwen3MoeForCausalLM: 4 experts of width 48 per sparse layer, 2 per
           token, norm_topk_prob true, layer 1 dense (mlp_only_layers), router and experts
           scaled up as Mixtral's, the load-balancing loss as Mixtral's (with GGUF: width 768,
           no dense layer, no load-balancing loss, as a GGUF file has none of these).
  With GGUF, a qwen2/qwen2_moe/qwen3/qwen3_moe/phi3/phi4_mini/gemma/gemma2/gemma3 model and
  vocabulary are also written there as llama.cpp lays out such a GGUF (f32 tensors).
Usage: hf_folder_reference.py CORPUS OUT [KIND [GGUF]]
       (KIND: deepseek_v2, deepseek_v3, gemma, gemma2, gemma3, llama2, mistral, mistral_nemo,
       mixtral, phi3, phi4_mini, qwen2, qwen2_moe, qwen3, qwen3_moe)
Produced with transformers 4.47.1, tokenizers 0.21, gguf 0.10.0, torch 1.13
(scripts/setup_python_refs.sh); qwen3, qwen3_moe, phi4_mini and the DeepSeeks, which
transformers 4.47 lacks, and the GGUFs but qwen2's and phi3's with transformers 5.15.1, gguf 0.19.0 and torch 2.11
(scripts/setup_deepspeed_peer.sh --torch2).
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_pretokenizers_reference import QWEN2_SPECIALS, o200k, qwen2, tekken  # noqa: E402
from tokenizer_sentencepiece_reference import llama2_tokenizer  # noqa: E402

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


GGUF_ARCH = {"qwen2": "qwen2", "qwen2_moe": "qwen2moe", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
GGUF_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
              "mlp.shared_expert.up_proj": "ffn_up_shexp",
              "mlp.shared_expert.down_proj": "ffn_down_shexp",
              "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def write_gguf(folder, kind, tok, path):
    """The saved folder as convert_hf_to_gguf.py writes a Qwen2, Qwen2-MoE, Qwen3 or Qwen3-MoE:
    no q/k row permutation, Qwen3's head size as attention.key_length, each layer's experts
    stacked, Qwen2-MoE's shared-expert gate a vector."""
    from gguf import GGUFWriter
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w = GGUFWriter(path, GGUF_ARCH[kind])
    w.add_name(kind + "-test")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if kind in ("qwen3", "qwen3_moe"):
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    if kind in ("qwen2_moe", "qwen3_moe"):
        w.add_expert_count(c.get("num_experts") or c["num_local_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if kind == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in QWEN2_SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_pad_token_id(c["bos_token_id"])
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    experts = {}  # (layer, proj) -> {expert: tensor}
    for name, t in sorted(load_file(os.path.join(folder, "model.safetensors")).items()):
        t = t.float().contiguous()
        if name in names:
            w.add_tensor(names[name], t.numpy())
            continue
        _, _, i, rest = name.split(".", 3)
        if rest.startswith("mlp.experts."):
            _, _, e, proj, _ = rest.split(".")
            experts.setdefault((i, proj[:-len("_proj")]), {})[int(e)] = t
            continue
        module, kind_ = rest.rsplit(".", 1)
        if module == "mlp.shared_expert_gate":
            t = t.reshape(-1)  # [1, hidden] -> [hidden], as llama.cpp reads it
        w.add_tensor(f"blk.{i}.{GGUF_LAYER[module]}.{kind_}", t.numpy())
    for (i, proj), by_expert in sorted(experts.items()):
        stacked = torch.stack([by_expert[e] for e in sorted(by_expert)])
        w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight", stacked.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


PHI3_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def add_sentencepiece_vocab(w, tokens):
    """The llama2 vocabulary as convert_hf_to_gguf.py's _set_vocab_sentencepiece writes one:
    scores and no merges, each piece scored below those learnt before it (so that merging by
    score merges in the trained order), <unk> <s> </s> then the 256 byte pieces."""
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0 if i < 3 + 256 else -float(i) for i in range(len(tokens))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259))
    w.add_unk_token_id(0)


def write_gemma_gguf(folder, kind, tok, path):
    """The saved Gemma, Gemma 2 or Gemma 3 folder as convert_hf_to_gguf.py's GemmaModel,
    Gemma2Model and Gemma3Model write it: every RMSNorm weight plus one, no lm_head (tied), the
    head size as key_length and value_length, gguf's own tensor names; Gemma 2's soft caps and
    window; Gemma 3's window and its global layers' rotary base and linear scaling; the
    SentencePiece vocabulary without the space prefix."""
    import gguf
    from gguf import GGUFWriter
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    arch = getattr(gguf.MODEL_ARCH, kind.upper())  # gguf 0.10 has no GEMMA3
    w = GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(kind + "-test")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    if kind == "gemma2":
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
        w.add_sliding_window(c["sliding_window"])
    if kind == "gemma3":
        full = c["rope_parameters"]["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
        w.add_sliding_window(c["sliding_window"])
    add_sentencepiece_vocab(w, [t for t, _ in sorted(tok.get_vocab().items(),
                                                      key=lambda kv: kv[1])])
    w.add_add_space_prefix(False)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_pad_token_id(c["pad_token_id"])
    names = gguf.get_tensor_name_map(arch, c["num_hidden_layers"])
    for name, t in sorted(load_file(os.path.join(folder, "model.safetensors")).items()):
        if name == "lm_head.weight":
            continue
        if name.endswith("norm.weight"):
            t = t + 1
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)),
                     t.float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_deepseek_gguf(folder, kind, tok, path):
    """The saved DeepSeek-V2 or V3 folder as convert_hf_to_gguf.py's DeepseekV2Model writes both
    (architecture deepseek2): the latent attention as one key/value head of kv_lora_rank +
    qk_rope_head_dim features with the per-head sizes as key_length_mla and value_length_mla,
    kv_b_proj split into attn_k_b (each head's key rows, transposed) and attn_v_b (its value
    rows), each layer's experts stacked, the router's scoring as expert_gating_func, the score
    correction bias as exp_probs_b, yarn as its factor, original context, betas and
    yarn_log_multiplier 0.1 mscale_all_dim; the SentencePiece vocabulary."""
    import gguf
    import torch
    from gguf import GGUFWriter
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    rope = c["rope_parameters"]
    r, nope, rot, v = (c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                       c["v_head_dim"])
    w = GGUFWriter(path, "deepseek2")
    w.add_name(kind + "-test")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if kind == "deepseek_v3"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    if c.get("q_lora_rank"):
        w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_key_length(r + rot)
    w.add_value_length(r)
    w.add_key_length_mla(nope + rot)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rot)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    add_sentencepiece_vocab(w, [t for t, _ in sorted(tok.get_vocab().items(),
                                                      key=lambda kv: kv[1])])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, c["num_hidden_layers"])
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    experts = {}
    for name, t in sorted(tensors.items()):
        t = t.float()
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if ".mlp.experts." in name:  # stacked below
            experts.setdefault((layer, name.split(".")[-2]), {})[int(name.split(".")[5])] = t
            continue
        if name.endswith("kv_b_proj.weight"):
            kv_b = t.view(c["num_attention_heads"], nope + v, r)
            k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
            w.add_tensor(f"blk.{layer}.attn_k_b.weight", k_b.transpose(1, 2).contiguous().numpy())
            w.add_tensor(f"blk.{layer}.attn_v_b.weight", v_b.contiguous().numpy())
            continue
        gguf_name = (f"blk.{layer}.exp_probs_b.bias" if name.endswith("e_score_correction_bias")
                     else names.get_name(name, try_suffixes=(".weight", ".bias")))
        w.add_tensor(gguf_name, t.contiguous().numpy())
    for (layer, proj), by_id in sorted(experts.items()):
        stacked = torch.stack([by_id[e] for e in sorted(by_id)])
        w.add_tensor(f"blk.{layer}.ffn_{proj.split('_')[0]}_exps.weight", stacked.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_phi3_gguf(folder, tok, path, byte_level):
    """The saved Phi-3 folder as convert_hf_to_gguf.py's Phi3MiniModel writes it: qkv_proj and
    gate_up_proj kept fused (attn_qkv, ffn_up), the rotated features of a head as
    rope.dimension_count, longrope's factors as the tensors rope_factors_short/long.weight with
    its attention factor, the original context, the sliding window (0: none); a SentencePiece
    vocabulary (phi3) with scores and no merges, each piece scored below those learnt before it
    (so that merging by score merges in the trained order), or a byte-level one (phi4_mini) with
    its merges and GPT-4o's pre-tokenizer, as Phi-4-mini's."""
    import math

    from gguf import GGUFWriter
    from safetensors.torch import load_file
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    n_embd, n_head = c["hidden_size"], c["num_attention_heads"]
    scaling = c.get("rope_scaling") or c["rope_parameters"]  # transformers 5 keeps it there
    theta = c.get("rope_theta") or scaling["rope_theta"]
    w = GGUFWriter(path, "phi3")
    w.add_name("phi3-test")
    w.add_context_length(c["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(c["original_max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(n_head)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(int(c.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
    w.add_rope_freq_base(theta)
    w.add_sliding_window(c.get("sliding_window") or 0)
    stretch = c["max_position_embeddings"] / c["original_max_position_embeddings"]
    w.add_rope_scaling_attn_factors(
        math.sqrt(1 + math.log(stretch) / math.log(c["original_max_position_embeddings"]))
        if stretch > 1.0 else 1.0)
    w.add_tensor("rope_factors_long.weight", torch.tensor(scaling["long_factor"]).numpy())
    w.add_tensor("rope_factors_short.weight", torch.tensor(scaling["short_factor"]).numpy())
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    if byte_level:
        merges = json.loads(tok.to_str())["model"]["merges"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o")
        w.add_token_list(tokens)
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
        w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
        w.add_add_bos_token(False)
    else:
        add_sentencepiece_vocab(w, tokens)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    for name, t in sorted(load_file(os.path.join(folder, "model.safetensors")).items()):
        t = t.float().contiguous().numpy()
        if name in names:
            w.add_tensor(names[name], t)
        else:
            _, _, i, rest = name.split(".", 3)
            module, kind_ = rest.rsplit(".", 1)
            w.add_tensor(f"blk.{i}.{PHI3_GGUF[module]}.{kind_}", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3_model(kind, tok_ids, gguf):
    """A Qwen3 or Qwen3-MoE (transformers >= 4.51) whose q/k norms and experts weigh in. For a
    GGUF, the sizes transformers' GGUF loader takes from Qwen3MoeConfig's defaults whatever the
    file says (expert width 768, every layer sparse)."""
    sizes = dict(SIZES, head_dim=128, vocab_size=tok_ids["vocab_size"],
                 bos_token_id=tok_ids["<|endoftext|>"],
                 eos_token_id=tok_ids["<|im_end|>"], rope_theta=1e6)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**sizes))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=768 if gguf else 48,
            norm_topk_prob=True, mlp_only_layers=[] if gguf else [1],
            **({} if gguf else dict(output_router_logits=True, router_aux_loss_coef=0.5)),
            **sizes))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
            if kind == "qwen3_moe" and hasattr(layer.mlp, "experts"):
                layer.mlp.gate.weight.normal_(0.0, 0.2)
                for p in layer.mlp.experts.parameters():
                    p.normal_(0.0, 0.15)
    return model


def phi3_model(sizes, partial, original):
    """A Phi-3 with longrope: random short and long factors, an original context of `original`
    positions; rotating the first `partial` of each head (Phi-4-mini's 0.75 needs transformers
    5, which reads partial_rotary_factor)."""
    head = sizes["hidden_size"] // sizes["num_attention_heads"]
    half = int(head * partial) // 2
    short = (1.0 + 0.3 * torch.rand(half)).tolist()
    long = (1.0 + 8.0 * torch.rand(half)).tolist()
    extra = {"partial_rotary_factor": partial} if partial != 1.0 else {}
    return Phi3ForCausalLM(Phi3Config(
        original_max_position_embeddings=original, pad_token_id=None, rope_scaling={
            "type": "longrope", "short_factor": short, "long_factor": long},
        **extra, **sizes))


GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP = 1.0, 0.5


def gemma_model(corpus, kind, gguf=False):
    """A GemmaForCausalLM (heads of 32 features on a 64-wide model with 4 heads, tied
    embeddings, the RMSNorms' offsets random: transformers starts them at zero, the identity)
    with the llama2 vocabulary tokenized as Gemma's tokenizer.json does: spaces replaced by
    "▁" and nothing prepended, so no space stripped when decoding. gemma2: a Gemma2ForCausalLM
    alike, its scores scaled by query_pre_attn_scalar 24 (not the head size), its window of 32
    positions in layer 0 (the 64 scored tokens pass it, the generation stays within it), its
    q/k projections scaled up so that the scores reach the cap, its scores and logits capped
    low enough that the caps weigh in (dropping either moves the score by 5e-4 or more).
    gemma3: a Gemma3ForCausalLM alike without caps, layer 0 sliding (rotating with base 1e4)
    and layer 1 global (base 1e6, linear scaling by 2), its q/k norms' offsets random.
    With GGUF, as llama.cpp runs them: Gemma 2 and 3 scale the scores by the head size
    (query_pre_attn_scalar 32), Gemma 3 has six layers, the last global."""
    from tokenizers import decoders, normalizers
    tok = llama2_tokenizer(corpus)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    sizes = dict(SIZES, tie_word_embeddings=True, head_dim=32, vocab_size=tok.get_vocab_size(),
                 bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 hidden_activation="gelu_pytorch_tanh")
    scalar = 32 if gguf else 24
    if kind == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            query_pre_attn_scalar=scalar, sliding_window=32, attn_logit_softcapping=GEMMA2_ATTN_CAP,
            final_logit_softcapping=GEMMA2_FINAL_CAP, **sizes))
    elif kind == "gemma3":
        if gguf:
            sizes["num_hidden_layers"] = 6
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            query_pre_attn_scalar=scalar, sliding_window=32,
            layer_types=["sliding_attention"] * (sizes["num_hidden_layers"] - 1) +
            ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            **sizes))
    else:
        model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**sizes))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            if kind == "gemma2" and ("q_proj" in name or "k_proj" in name):
                p.normal_(0.0, 0.3)
    return tok, model


def qwen2_moe_model(sizes, gguf):
    """A Qwen2-MoE: 4 experts of width 48, 2 per token, not renormalised, layer 0 dense, a
    shared expert of width 80 (scaled up as the routed ones) whose gate weighs in, the
    load-balancing loss weighted 0.5. For a GGUF, what transformers' GGUF loader takes from
    Qwen2MoeConfig's defaults whatever the file says: widths 1408 and 5632, every layer
    sparse; the experts' down projections scaled down as they widen."""
    if gguf:
        widths = dict(moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                      mlp_only_layers=[])
    else:
        widths = dict(moe_intermediate_size=48, shared_expert_intermediate_size=80,
                      mlp_only_layers=[0], output_router_logits=True, router_aux_loss_coef=0.5)
    model = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, **widths, **sizes))
    with torch.no_grad():
        for layer in model.model.layers:
            block = layer.mlp
            if not hasattr(block, "experts"):
                continue
            block.gate.weight.normal_(0.0, 0.2)
            block.shared_expert_gate.weight.normal_(0.0, 0.5)
            for name, p in list(block.experts.named_parameters()) + list(
                    block.shared_expert.named_parameters()):
                narrow = (48 / p.shape[-1]) ** 0.5 if gguf and "down" in name else 1.0
                p.normal_(0.0, 0.15 * narrow)
    return model


def deepseek_model(kind, sizes, gguf=False):
    """A DeepSeek-V2 or V3 (transformers >= 5): multi-head latent attention (V3 with a query
    bottleneck of rank 24, V2 as V2-Lite without), a key/value latent of rank 16, heads of 16
    unrotated and 8 rotated query/key features and 16 value features, yarn scaling (factor 4
    of an original context of 64; mscale 1 and mscale_all_dim 0.8, so that both the rotation
    and the softmax scale move), layer 0 dense and layer 1 sparse:
    8 experts of width 32 in 4 groups, 2 per token within the 2 best groups (V2 by
    group_limited_greedy, V3 by its two best and a random score correction bias), shared
    experts, the weights scaled by routed_scaling_factor; router and experts scaled up as
    Mixtral's, the attention's input projections so that its scores weigh in (dropping yarn's
    softmax scale or the pairing of the rotated features moves the score by 1e-3 or more).
    With GGUF, mscale is mscale_all_dim, as DeepSeek's own configs set it and as a GGUF file
    (yarn_log_multiplier only) can say it."""
    common = dict(sizes, q_lora_rank=24 if kind == "deepseek_v3" else None, kv_lora_rank=16,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
                  moe_intermediate_size=32, num_experts_per_tok=2, n_group=4, topk_group=2,
                  first_k_dense_replace=1, num_key_value_heads=sizes["num_attention_heads"],
                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64, "beta_fast": 32,
                                   "beta_slow": 1, "mscale": 0.8 if gguf else 1.0,
                                   "mscale_all_dim": 0.8})
    if kind == "deepseek_v3":
        model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
            n_shared_experts=1, routed_scaling_factor=2.5, **common))
    else:
        model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
            n_shared_experts=2, routed_scaling_factor=1.5, topk_method="group_limited_greedy",
            **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "self_attn" in name and "proj" in name and "o_proj" not in name:
                p.normal_(0.0, 0.3)
        block = model.model.layers[1].mlp
        block.gate.weight.normal_(0.0, 0.2)
        if kind == "deepseek_v3":
            block.gate.e_score_correction_bias.uniform_(-0.1, 0.1)
        for p in block.experts.parameters():
            p.normal_(0.0, 0.15)
    return model


def main():
    corpus, out = sys.argv[1:3]
    kind = sys.argv[3] if len(sys.argv) > 3 else "llama2"
    torch.manual_seed(20261206)
    if kind in ("gemma", "gemma2", "gemma3"):
        tok, model = gemma_model(corpus, kind, gguf=len(sys.argv) > 4)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                  "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 256,
                  "clean_up_tokenization_spaces": False}
    elif kind == "mistral_nemo":  # byte-level BPE on Tekken's pattern, as Mistral NeMo's own
        tok = tekken(corpus)
        model = MistralForCausalLM(MistralConfig(
            head_dim=32, sliding_window=None, rope_theta=1e6, vocab_size=tok.get_vocab_size(),
            bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"), **SIZES))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                  "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 256,
                  "clean_up_tokenization_spaces": False}
    elif kind == "phi4_mini":  # byte-level BPE on GPT-4o's pattern, as Phi-4-mini's own
        tok = o200k(corpus)
        end = tok.token_to_id("<|endoftext|>")
        model = phi3_model(dict(vocab_size=tok.get_vocab_size(), bos_token_id=end,
                                eos_token_id=end, **SIZES), partial=0.75, original=48)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                  "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                  "model_max_length": 256, "clean_up_tokenization_spaces": False}
    elif kind in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        tok = qwen2(corpus)
        ids = {t: tok.token_to_id(t) for t in QWEN2_SPECIALS}
        if kind in ("qwen2", "qwen2_moe"):
            sizes = dict(vocab_size=tok.get_vocab_size(), bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], **SIZES)
            if kind == "qwen2":
                model = Qwen2ForCausalLM(Qwen2Config(**sizes))
            else:
                model = qwen2_moe_model(sizes, gguf=len(sys.argv) > 4)
            # Qwen2-MoE's smaller: biases of 0.5 would drown its sparse block in the residual.
            bias_std = 0.5 if kind == "qwen2" else 0.05
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                 layer.self_attn.v_proj):
                        proj.bias.normal_(0.0, bias_std)
        else:
            model = qwen3_model(kind, dict(ids, vocab_size=tok.get_vocab_size()),
                                gguf=len(sys.argv) > 4)
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
            model = MixtralForCausalLM(MixtralConfig(
                num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                router_aux_loss_coef=0.5, **sizes))
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.block_sparse_moe.gate.weight.normal_(0.0, 0.2)
                    for p in layer.block_sparse_moe.experts.parameters():
                        p.normal_(0.0, 0.15)
        elif kind == "phi3":
            model = phi3_model(sizes, partial=1.0, original=16)
        elif kind in ("deepseek_v2", "deepseek_v3"):
            model = deepseek_model(kind, sizes, gguf=len(sys.argv) > 4)
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
    if len(sys.argv) > 4 and kind in ("gemma", "gemma2", "gemma3"):
        write_gemma_gguf(out, kind, tok, sys.argv[4])
    elif len(sys.argv) > 4 and kind in ("deepseek_v2", "deepseek_v3"):
        write_deepseek_gguf(out, kind, tok, sys.argv[4])
    elif len(sys.argv) > 4 and kind in ("phi3", "phi4_mini"):
        write_phi3_gguf(out, tok, sys.argv[4], byte_level=kind == "phi4_mini")
    elif len(sys.argv) > 4:
        write_gguf(out, kind, tok, sys.argv[4])


if __name__ == "__main__":
    main()

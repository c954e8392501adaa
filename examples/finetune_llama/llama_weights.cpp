// Llama weight sources and the Hugging Face folder writer (see llama_weights.h).
#include "llama_weights.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/checkpoint.h"
#include "deepspeed/linear.h"
#include "deepspeed/zero3.h"
#include "gguf_file.h"
#include "util/check.h"

namespace deepspeed::examples {
namespace fs = std::filesystem;
namespace {

// Hugging Face suffix within a layer -> GGUF suffix (llama.cpp's tensor names for "llama",
// "qwen2", "qwen3", "qwen2moe" and "qwen3moe"; the experts are gguf_expert_slice's).
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},  // Qwen2
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},  // Qwen3
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},  // Qwen3-MoE's router
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},  // Mixtral's
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},  // Qwen2-MoE's
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  // Phi-3's fused projections
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
};

// DeepSeek's latent attention, shared experts and router bias (llama.cpp's "deepseek2" names;
// kv_b_proj may instead be split in two, see deepseek_kv_b).
const std::pair<const char*, const char*> kDeepSeekNames[] = {
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_proj.bias", "attn_q_a.bias"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_proj_with_mqa.bias", "attn_kv_a_mqa.bias"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
};

// Gemma 2's and Gemma 3's four norms per layer, which llama.cpp names apart from a Llama's
// (post_attention_layernorm is theirs after the attention; the MLP's input norm is ffn_norm).
const std::pair<const char*, const char*> kSandwichNormNames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

// One expert's projection in llama.cpp's layout: the experts of a layer stacked in one tensor
// ("model.layers.3.mlp.experts.5.up_proj.weight" -> "blk.3.ffn_up_exps.weight", expert 5;
// Mixtral's "block_sparse_moe.experts.5.w3.weight" alike, w1 the gate and w2 the down
// projection). `legacy` is the same expert's tensor in the files llama.cpp wrote before it
// stacked them ("blk.3.ffn_up.5.weight"), which it still reads.
struct GgufExpertSlice {
  std::string stacked;
  int64_t expert = 0;
  std::string legacy;
};

std::optional<GgufExpertSlice> gguf_expert_slice(const std::string& hf_name) {
  static const std::regex expert(
      R"(model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.)"
      R"(((gate|up|down)_proj|w1|w2|w3)\.weight)");
  std::smatch m;
  if (!std::regex_match(hf_name, m, expert)) return std::nullopt;
  const std::string w = m[4].str();
  const std::string proj = w == "w1" ? "gate" : w == "w2" ? "down" : w == "w3" ? "up" : m[5].str();
  const std::string blk = "blk." + m[1].str() + ".ffn_" + proj;
  return GgufExpertSlice{blk + "_exps.weight", std::stoll(m[3].str()),
                         blk + "." + m[3].str() + ".weight"};
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  DS_CHECK(in.good(), ModelFileError, "Hugging Face folder ", fs::path(path).parent_path().string(),
           ": ", what, " (", path, ") is missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DS_CHECK(false, ModelFileError, path, ": not valid JSON (", e.what(), ")");
  }
  return {};
}

// Phi-3's files fuse q/k/v into self_attn.qkv_proj (rows q, then k, then v) and gate/up into
// mlp.gate_up_proj (gate rows first); the model keeps them apart as a Llama does. Each fused
// tensor is read once, kept until its last part is taken.
struct FusedPart {
  std::string fused;
  int64_t begin = 0, end = 0;  // its rows
  int64_t rows = 0;            // the fused tensor's
  bool last() const { return end == rows; }
};

std::optional<FusedPart> phi3_fused_part(const LlamaConfig& c, const std::string& hf_name) {
  static const std::regex part(
      R"((model\.layers\.\d+\.)(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.weight)");
  std::smatch m;
  if (!std::regex_match(hf_name, m, part)) return std::nullopt;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t ffn = c.intermediate_size;
  const std::string layer = m[1].str();
  if (m[3].matched) {
    const std::string w = m[3].str();
    const std::string fused = layer + "self_attn.qkv_proj.weight";
    const int64_t rows = q + 2 * kv;
    if (w == "q") return FusedPart{fused, 0, q, rows};
    if (w == "k") return FusedPart{fused, q, q + kv, rows};
    return FusedPart{fused, q + kv, rows, rows};
  }
  const std::string fused = layer + "mlp.gate_up_proj.weight";
  if (m[4].str() == "gate") return FusedPart{fused, 0, ffn, 2 * ffn};
  return FusedPart{fused, ffn, 2 * ffn, 2 * ffn};
}

// `fused_in_file` says whether the file holds a fused tensor (a GGUF file may keep q/k/v apart;
// a Hugging Face folder always fuses them). `source` names the file in errors.
LlamaWeightSource phi3_unfused(LlamaWeightSource file, const LlamaConfig& c,
                               const std::string& source,
                               std::function<bool(const std::string&)> fused_in_file) {
  auto kept = std::make_shared<std::pair<std::string, at::Tensor>>();
  return [file = std::move(file), c, source, fused_in_file = std::move(fused_in_file),
          kept](const std::string& hf_name) {
    const auto part = phi3_fused_part(c, hf_name);
    if (!part || !fused_in_file(part->fused)) return file(hf_name);
    if (kept->first != part->fused) *kept = {part->fused, file(part->fused)};
    const at::Tensor& fused = kept->second;
    DS_CHECK(fused.dim() == 2 && fused.size(0) == part->rows, ModelFileError, source,
             ": tensor '", part->fused, "' has shape ", fused.sizes(),
             "; the model config expects ", part->rows, " rows");
    at::Tensor w = fused.slice(0, part->begin, part->end);
    if (part->last()) *kept = {};
    return w;
  };
}

// llama.cpp's converter now stores DeepSeek's kv_b_proj [heads * (nope + v), rank] as two
// tensors for its absorbed attention: attn_k_b, each head's key rows transposed [heads, rank,
// nope], and attn_v_b, its value rows [heads, v, rank]; joined back here. nullopt where the file
// holds attn_kv_b whole (the converters before).
std::optional<at::Tensor> deepseek_kv_b(const GgufFile& file, const LlamaConfig& cfg,
                                        const std::string& hf_name) {
  static const std::regex kv_b(R"(model\.layers\.(\d+)\.self_attn\.kv_b_proj\.weight)");
  std::smatch m;
  if (!cfg.deepseek() || !std::regex_match(hf_name, m, kv_b)) return std::nullopt;
  const std::string blk = "blk." + m[1].str() + ".";
  if (file.find_tensor(blk + "attn_kv_b.weight") != nullptr) return std::nullopt;
  const at::Tensor k = file.load_tensor(blk + "attn_k_b.weight", at::kFloat);
  const at::Tensor v = file.load_tensor(blk + "attn_v_b.weight", at::kFloat);
  const int64_t heads = cfg.num_attention_heads, rank = cfg.kv_lora_rank;
  DS_CHECK(k.sizes() == at::IntArrayRef({heads, rank, cfg.qk_nope_head_dim}) &&
               v.sizes() == at::IntArrayRef({heads, cfg.v_head_dim, rank}),
           ModelFileError, "GGUF file ", file.path(), ": tensors '", blk, "attn_k_b.weight' ",
           k.sizes(), " and '", blk, "attn_v_b.weight' ", v.sizes(), " are not [", heads, ", ",
           rank, ", ", cfg.qk_nope_head_dim, "] and [", heads, ", ", cfg.v_head_dim, ", ", rank,
           "]");
  return at::cat({k.transpose(1, 2), v}, 1).reshape({-1, rank}).contiguous();
}

LlamaCheckpoint open_gguf(const std::string& path) {
  auto file = std::make_shared<GgufFile>(GgufFile::open(path));
  LlamaCheckpoint ck;
  ck.path = path;
  ck.is_gguf = true;
  ck.config = LlamaConfig::from_gguf(*file);
  const LlamaConfig cfg = ck.config;
  // The model asks for the experts one at a time, each stack's in a row: the stack last read is
  // kept until its last expert is taken, rather than dequantised once per expert.
  auto stack = std::make_shared<std::pair<std::string, at::Tensor>>();
  ck.weights = [file, cfg, stack](const std::string& hf_name) {
    if (const auto slice = gguf_expert_slice(hf_name)) {
      if (file->find_tensor(slice->stacked) == nullptr) {
        DS_CHECK(file->find_tensor(slice->legacy) != nullptr, ModelFileError, "GGUF file ",
                 file->path(), ": expert ", slice->expert, " of '", hf_name, "' is in neither '",
                 slice->stacked, "' nor '", slice->legacy, "'");
        return file->load_tensor(slice->legacy, at::kFloat);
      }
      if (stack->first != slice->stacked) {
        *stack = {slice->stacked, file->load_tensor(slice->stacked, at::kFloat)};
      }
      DS_CHECK(stack->second.dim() == 3 && slice->expert < stack->second.size(0), ModelFileError,
               "GGUF file ", file->path(), ": tensor '", slice->stacked, "' of shape ",
               stack->second.sizes(), " holds no expert ", slice->expert);
      at::Tensor w = stack->second[slice->expert];
      if (slice->expert + 1 == stack->second.size(0)) *stack = {};
      return w;
    }
    if (auto kv_b = deepseek_kv_b(*file, cfg, hf_name)) return *kv_b;
    at::Tensor w = file->load_tensor(gguf_tensor_name(hf_name, cfg.model_type), at::kFloat);
    const auto ends = [&](const char* s) {
      return hf_name.size() >= std::strlen(s) && hf_name.compare(hf_name.size() - std::strlen(s), std::string::npos, s) == 0;
    };
    // llama.cpp's converter stores a Gemma's RMSNorm weights plus one (its norm multiplies by
    // the weight; transformers' by one plus it).
    if (cfg.gemma() && ends("norm.weight")) return w - 1.0;
    // llama.cpp keeps Qwen2-MoE's shared-expert gate [1, hidden] as a vector.
    if (ends("mlp.shared_expert_gate.weight") && w.dim() == 1) return w.unsqueeze(0);
    // llama.cpp permutes a "llama" model's (and so a Mixtral's) q/k rows to its rotary layout;
    // a "qwen2" model's rotary layout is transformers' own, so its rows are as they were.
    if (cfg.model_type != "llama" && cfg.model_type != "mixtral") return w;
    if (ends("self_attn.q_proj.weight")) return unpermute_rope_rows(w, cfg.num_attention_heads);
    if (ends("self_attn.k_proj.weight")) return unpermute_rope_rows(w, cfg.num_key_value_heads);
    return w;
  };
  // llama.cpp's Phi-3 keeps Phi-3's fused layout and rows (ffn_up holds gate, then up).
  if (cfg.model_type == "phi3") {
    ck.weights = phi3_unfused(ck.weights, cfg, "GGUF file " + path,
                              [file](const std::string& fused) {
                                return file->find_tensor(gguf_tensor_name(fused)) != nullptr;
                              });
  }
  return ck;
}

LlamaCheckpoint open_hf_folder(const std::string& dir) {
  LlamaCheckpoint ck;
  ck.path = dir;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  ck.config = LlamaConfig::from_hf_json(read_json(config_path, "config.json"), config_path);
  // name -> file: one model.safetensors, or an index's weight_map over shards.
  auto where = std::make_shared<std::map<std::string, std::string>>();
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto j = read_json(index.string(), "model.safetensors.index.json");
    DS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), ModelFileError, index.string(),
             ": 'weight_map' is missing or not an object");
    for (const auto& [name, file] : j["weight_map"].items())
      (*where)[name] = (fs::path(dir) / file.get<std::string>()).string();
  } else {
    DS_CHECK(fs::exists(single), ModelFileError, "Hugging Face folder ", dir,
             ": neither model.safetensors nor model.safetensors.index.json is there");
    for (const auto& item : checkpoint::load_safetensors(single.string())) (*where)[item.key()] = single.string();
  }
  // Shards are read once each, on first use.
  auto shards = std::make_shared<std::map<std::string, checkpoint::TensorDict>>();
  ck.weights = [where, shards, dir](const std::string& hf_name) {
    auto it = where->find(hf_name);
    DS_CHECK(it != where->end(), ModelFileError, "Hugging Face folder ", dir, ": tensor '", hf_name,
             "' is in no *.safetensors file");
    auto s = shards->find(it->second);
    if (s == shards->end()) s = shards->emplace(it->second, checkpoint::load_safetensors(it->second)).first;
    const at::Tensor* t = s->second.find(hf_name);
    DS_CHECK(t != nullptr, ModelFileError, it->second, ": tensor '", hf_name,
             "' is listed in the index but not in the file");
    return t->to(at::kFloat);
  };
  if (ck.config.model_type == "phi3") {
    ck.weights = phi3_unfused(ck.weights, ck.config, "Hugging Face folder " + dir,
                              [](const std::string&) { return true; });
  }
  // The embedding decides the vocabulary: a config that disagrees is an error here, not a
  // shape mismatch deep inside the model.
  const at::Tensor embed = ck.weights("model.embed_tokens.weight");
  DS_CHECK(embed.dim() == 2 && embed.size(0) == ck.config.vocab_size, ModelFileError, config_path,
           ": vocab_size is ", ck.config.vocab_size, " but model.embed_tokens.weight has shape ",
           embed.sizes());
  return ck;
}

}  // namespace

std::string gguf_tensor_name(const std::string& hf_name, const std::string& model_type) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(hf_name, m, layer)) {
    if (model_type == "deepseek_v2" || model_type == "deepseek_v3") {
      for (const auto& [hf, gguf] : kDeepSeekNames) {
        if (m[2] == hf) return "blk." + m[1].str() + "." + gguf;
      }
    }
    if (model_type == "gemma2" || model_type == "gemma3_text") {
      for (const auto& [hf, gguf] : kSandwichNormNames) {
        if (m[2] == hf) return "blk." + m[1].str() + "." + gguf;
      }
    }
    for (const auto& [hf, gguf] : kLayerNames) {
      if (m[2] == hf) return "blk." + m[1].str() + "." + gguf;
    }
  }
  DS_CHECK(false, ModelFileError, "parameter '", hf_name, "' has no GGUF tensor name");
  return {};
}

at::Tensor unpermute_rope_rows(const at::Tensor& w, int64_t n_head) {
  const int64_t rows = w.size(0);
  DS_CHECK(rows % (2 * n_head) == 0, ModelFileError, "q/k projection with ", rows,
           " rows cannot hold ", n_head, " heads of an even size");
  std::vector<int64_t> shape = {n_head, rows / n_head / 2, 2};
  for (int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes()).contiguous();
}

LlamaCheckpoint open_llama_checkpoint(const std::string& path) {
  DS_CHECK(fs::exists(path), ModelFileError, "model ", path,
           ": not found (give --model a .gguf file or a Hugging Face folder)");
  if (fs::is_directory(path)) return open_hf_folder(path);
  return open_gguf(path);
}

void save_hf_weights(LlamaForCausalLMImpl& model, const std::string& dir, bool write) {
  zero::GatheredParameters gathered(model);  // no-op unless ZeRO-3 partitions them
  // LoRA projections are written as the plain weights they amount to (W + alpha/r B A), under
  // the projection's name; merging a sharded base weight all-gathers it, so every rank merges.
  std::map<std::string, at::Tensor> merged;
  std::set<const c10::TensorImpl*> merged_params;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* lora = dynamic_cast<linear::OptimizedLinearImpl*>(item.value().get());
    if (lora == nullptr || !lora->lora_enabled()) continue;
    merged[item.key() + ".weight"] = lora->merged_weight();
    if (lora->bias.defined()) merged[item.key() + ".bias"] = lora->bias.to(at::kFloat);
    for (const auto& p : lora->parameters()) merged_params.insert(p.unsafeGetTensorImpl());
  }
  // Mixtral's and Qwen3-MoE's experts: whole (gathered from the expert-parallel group when
  // AutoEP sharded them), then one tensor per expert under transformers' names.
  std::map<std::string, at::Tensor> experts;
  for (const auto& [name, layer] : moe::token_choice_layers(model)) {
    const char* names[] = {"w1", "w2", "w3"};
    const auto params = layer->expert_parameters();
    for (size_t w = 0; w < params.size(); ++w) {
      at::Tensor whole = params[w].detach().to(at::kFloat).contiguous();
      if (const moe::ExpertGroups* g = layer->ep_groups(); g && g->ep_size > 1) {
        const int ep = g->expert_parallel.size();
        at::Tensor all = at::empty({ep * whole.numel()}, whole.options());
        comm::all_gather(all, whole.view({-1}), false, g->expert_parallel);
        std::vector<int64_t> shape = whole.sizes().vec();
        shape[0] *= ep;
        whole = all.view(shape);
      }
      experts[name + ".experts." + names[w]] = whole;
      merged_params.insert(params[w].unsafeGetTensorImpl());
    }
  }
  if (!write) return;
  fs::create_directories(dir);
  checkpoint::TensorDict tensors;
  // Phi-3's q/k/v and gate/up projections, by fused tensor and first row, fused below.
  std::map<std::string, std::map<int64_t, at::Tensor>> fused;
  const auto put = [&](const std::string& name, const at::Tensor& t) {
    if (model.config().model_type == "phi3") {
      if (const auto part = phi3_fused_part(model.config(), name)) {
        fused[part->fused][part->begin] = t;
        return;
      }
    }
    tensors.insert(name, t.contiguous());
  };
  for (const auto& item : model.named_parameters()) {
    if (auto e = experts.find(item.key()); e != experts.end()) {
      for (int64_t i = 0; i < e->second.size(0); ++i) {
        tensors.insert(hf_expert_name(model.config(), item.key(), i), e->second[i].contiguous());
      }
      continue;
    }
    if (merged_params.count(item.value().unsafeGetTensorImpl())) {
      auto it = merged.find(item.key());
      if (it != merged.end()) put(item.key(), it->second);
      continue;
    }
    put(item.key(), item.value().detach().to(at::kFloat));
  }
  // DeepSeek-V3's router bias, a buffer transformers loads from the file.
  for (const auto& item : model.named_buffers()) {
    if (item.key().find("e_score_correction_bias") == std::string::npos) continue;
    tensors.insert(item.key(), item.value().detach().to(at::kFloat).contiguous());
  }
  for (const auto& [name, parts] : fused) {
    std::vector<at::Tensor> rows;
    for (const auto& part : parts) rows.push_back(part.second);
    tensors.insert(name, at::cat(rows, 0).contiguous());
  }
  checkpoint::save_safetensors(tensors, (fs::path(dir) / "model.safetensors").string());
  const LlamaConfig& cfg = model.config();
  std::ofstream(fs::path(dir) / "config.json") << cfg.to_hf_json().dump(2) << "\n";
  nlohmann::json gen = {{"do_sample", false}};
  if (cfg.bos_token_id >= 0) gen["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_id >= 0) gen["eos_token_id"] = cfg.eos_token_id;
  if (cfg.pad_token_id >= 0) gen["pad_token_id"] = cfg.pad_token_id;
  std::ofstream(fs::path(dir) / "generation_config.json") << gen.dump(2) << "\n";
}

}  // namespace deepspeed::examples

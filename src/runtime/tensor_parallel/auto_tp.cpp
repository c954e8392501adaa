// AutoTP (DeepSpeed's module_inject/auto_tp.py for training): finds the linear layers of a model
// by name, splits them over a tensor-parallel group in place and remembers how each must
// communicate, so that a model calling its projections through tp::linear() runs sharded
// without being rewritten.
#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include <torch/torch.h>

#include "deepspeed/compression.h"
#include "deepspeed/tensor_parallel.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::tensor_parallel {
namespace {

enum class Role { kColumn, kRow };

struct LayerRole {
  std::weak_ptr<torch::nn::Module> module;
  Role role;
  comm::Group group;
};

std::mutex& roles_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const torch::nn::LinearImpl*, LayerRole>& roles() {
  static std::unordered_map<const torch::nn::LinearImpl*, LayerRole> r;
  return r;
}

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

struct Found {
  std::string name, parent, last;
  std::shared_ptr<torch::nn::LinearImpl> layer;
};

void check_divisible(const std::string& layer, const char* what, int64_t size, int T) {
  DS_CHECK(size % T == 0, ConfigError, "tensor_parallel (AutoTP): ", layer, ": ", what, " (",
           size, ") is not divisible by the tensor-parallel size autotp_size (", T, ")");
}

void shard_in_place(at::Tensor& param, int dim, const comm::Group& group, int stride) {
  torch::NoGradGuard no_grad;
  param.set_data(shard_of(param.detach(), dim, group.size(), group.rank(), stride));
  mark_tensor_parallel(param, group, dim, stride);
}

}  // namespace

std::string AutoTpPlan::describe() const {
  std::ostringstream os;
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    os << what << " [";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  };
  list("fused qkv (column, stride 3)", fused_qkv);
  os << "; ";
  list("column", column);
  os << "; ";
  list("row", row);
  return os.str();
}

AutoTpPlan auto_tp(torch::nn::Module& model, const comm::Group& group, AutoTpOptions options) {
  const int T = group.size();
  DS_CHECK(group.is_member(), UsageError, "tensor_parallel::auto_tp: this rank is not in ",
           group.describe());
  // The full model must be the same on every rank of the group before each keeps its slice.
  if (T > 1) {
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters()) {
      at::Tensor t = p.detach().contiguous();
      comm::broadcast(t, group.global_rank(0), false, group);
      if (!t.is_alias_of(p)) p.detach().copy_(t);
    }
  }
  std::vector<Found> linears;
  std::set<const torch::nn::Module*> seen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (!lin || !seen.insert(lin.get()).second) continue;
    const std::string& name = item.key();
    const size_t dot = name.rfind('.');
    Found f;
    f.name = name;
    f.parent = dot == std::string::npos ? "" : name.substr(0, dot);
    f.last = dot == std::string::npos ? name : name.substr(dot + 1);
    f.layer = lin;
    linears.push_back(std::move(f));
  }
  std::set<std::string> parents_with_row;
  for (const auto& f : linears) {
    if (contains(options.row_parallel_names, f.last)) parents_with_row.insert(f.parent);
  }
  if (options.num_heads > 0) {
    DS_CHECK(options.num_heads % T == 0, ConfigError,
             "tensor_parallel (AutoTP): the number of attention heads (", options.num_heads,
             ") is not divisible by the tensor-parallel size autotp_size (", T, ")");
  }
  AutoTpPlan plan;
  std::vector<std::pair<const Found*, Role>> chosen;
  for (const auto& f : linears) {
    auto& lin = *f.layer;
    const int64_t out = lin.weight.size(0), in = lin.weight.size(1);
    if (contains(options.fused_qkv_names, f.last)) {
      DS_CHECK(out % 3 == 0, ConfigError, "tensor_parallel (AutoTP): ", f.name,
               ": a fused q|k|v projection needs out_features divisible by 3, got ", out);
      check_divisible(f.name, "the hidden size (out_features / 3)", out / 3, T);
      plan.fused_qkv.push_back(f.name);
      chosen.emplace_back(&f, Role::kColumn);
    } else if (contains(options.row_parallel_names, f.last)) {
      check_divisible(f.name, "in_features", in, T);
      plan.row.push_back(f.name);
      chosen.emplace_back(&f, Role::kRow);
    } else if (parents_with_row.count(f.parent)) {
      check_divisible(f.name, "out_features", out, T);
      plan.column.push_back(f.name);
      chosen.emplace_back(&f, Role::kColumn);
    }
  }
  for (const auto& [f, role] : chosen) {
    auto& lin = *f->layer;
    const int stride = contains(options.fused_qkv_names, f->last) ? 3 : 1;
    if (role == Role::kColumn) {
      shard_in_place(lin.weight, 0, group, stride);
      if (lin.bias.defined()) shard_in_place(lin.bias, 0, group, stride);
    } else {
      shard_in_place(lin.weight, 1, group, 1);  // the bias stays whole, added once
    }
    std::lock_guard<std::mutex> lock(roles_mutex());
    roles()[f->layer.get()] = LayerRole{f->layer, role, group};
  }
  return plan;
}

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  const torch::nn::LinearImpl* impl = layer.get();
  std::optional<LayerRole> role;
  {
    std::lock_guard<std::mutex> lock(roles_mutex());
    auto it = roles().find(impl);
    if (it != roles().end() && !it->second.module.expired()) role = it->second;
  }
  // Not sharded: the layer's own forward, compressed when compression_training set it up.
  if (!role) return compression::linear(layer, x);
  if (role->role == Role::kColumn) {
    return at::linear(copy_to_model_parallel_region(x, role->group), impl->weight, impl->bias);
  }
  at::Tensor y = reduce_from_model_parallel_region(at::linear(x, impl->weight), role->group);
  return impl->bias.defined() ? y + impl->bias : y;
}

}  // namespace deepspeed::tensor_parallel

// MuonWithAuxAdam: Muon groups through muon_update (newton_schulz.cpp), Adam groups through
// deepspeed::optim::Adam's update, one state map for both.
#include <algorithm>

#include <ATen/ATen.h>

#include "deepspeed/muon.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

// Python's param_groups carry no defaults dict for MuonWithAuxAdam (it passes dict()): each
// group is complete once its half's defaults are filled in, here.
std::vector<torch::optim::OptimizerParamGroup> with_defaults(
    std::vector<torch::optim::OptimizerParamGroup> groups, const MuonOptions& muon,
    const MuonAdamOptions& adam) {
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = groups[g];
    auto* options = group.has_options() ? dynamic_cast<GroupOptions*>(&group.options()) : nullptr;
    DS_CHECK(options != nullptr && options->has("use_muon"), UsageError,
             "MuonWithAuxAdam: param group ", g, " has no \"use_muon\" flag; every group must say "
             "whether Muon (true) or Adam (false) updates it");
    const bool use_muon = options->flag("use_muon");
    const GroupOptions defaults = use_muon ? muon.group() : adam.group();
    for (const auto& [name, value] : defaults.items()) {
      if (!options->has(name)) options->set(name, value);
    }
    if (use_muon) {
      (void)parse_ns_method(options->text("ns_method"),
                            "MuonWithAuxAdam: param group " + std::to_string(g) + " ns_method");
      // Matches MuonWithAuxAdam: largest matrix first (Python's sorted(params, key=size,
      // reverse=True) compares sizes as tuples and keeps ties in order), which sets the state's
      // indices and ZeRO's flattening order.
      std::stable_sort(group.params().begin(), group.params().end(),
                       [](const at::Tensor& a, const at::Tensor& b) {
                         const auto sa = a.sizes();
                         const auto sb = b.sizes();
                         return std::lexicographical_compare(sb.begin(), sb.end(), sa.begin(),
                                                             sa.end());
                       });
      for (const auto& p : group.params()) {
        DS_CHECK(p.dim() >= 2, UsageError, "MuonWithAuxAdam: param group ", g,
                 " runs Muon (use_muon true) but holds a parameter of shape ", p.sizes(),
                 "; Muon orthogonalizes matrices, so give 1-D parameters to an Adam group");
      }
    }
  }
  return groups;
}

GroupOptions lr_only(double lr) {
  GroupOptions g;
  g.set("lr", lr);
  return g;
}

}  // namespace

GroupOptions MuonOptions::group() const {
  // MuonWithAuxAdam's keys for a Muon group, in the order its constructor sets them.
  GroupOptions g;
  g.set("use_muon", true).set("lr", lr).set("momentum", momentum);
  g.set("weight_decay", weight_decay).set("ns_method", std::string(ns_method_name(ns_method)));
  return g;
}

GroupOptions MuonAdamOptions::group() const {
  GroupOptions g;
  g.set("use_muon", false).set("lr", lr).set("betas", betas).set("eps", eps);
  g.set("weight_decay", weight_decay).set("bias_correction", true);
  return g;
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> groups, bool adam_w_mode,
           MuonOptions muon, MuonAdamOptions adam)
    : DsOptimizer(with_defaults(std::move(groups), muon, adam), lr_only(muon.lr)),
      adam_(std::make_unique<Adam>(std::vector<torch::optim::OptimizerParamGroup>{},
                                   AdamOptions{}, adam_w_mode)) {}

Muon::~Muon() = default;

bool Muon::adam_w_mode() const { return adam_->adam_w_mode(); }

bool Muon::is_muon_group(const GroupOptions& group) {
  return group.has("use_muon") && group.flag("use_muon");
}

std::vector<std::string> Muon::state_names(const GroupOptions& group) const {
  if (is_muon_group(group)) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

bool Muon::counts_steps(const GroupOptions& group) const { return !is_muon_group(group); }

// By the first element's address: step() hands update_group() detached handles of the
// parameters, which share the memory but not the TensorImpl.
void Muon::mark_orthogonalized(const at::Tensor& param) {
  orthogonalized_.insert(param.data_ptr());
}

bool Muon::orthogonalized(const at::Tensor& param) const {
  return orthogonalized_.count(param.data_ptr()) > 0;
}

void Muon::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                  const GroupOptions& group) {
  std::vector<ParamUpdate> one{ParamUpdate{param, grad, state, at::Tensor()}};
  update_group(one, group);
}

void Muon::update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) {
  if (!is_muon_group(group)) return adam_->update_group(params, group);
  const double lr = group.number("lr");
  const double weight_decay = group.number("weight_decay");
  const double beta = group.number("momentum");
  const NsMethod method = parse_ns_method(group.text("ns_method"), "ns_method");
  for (ParamUpdate& u : params) {
    // A flat partition's gradient holds the update already (ZeRO orthogonalized it).
    const at::Tensor update =
        orthogonalized(u.param)
            ? u.grad
            : muon_update(u.grad, u.state.tensor("momentum_buffer"), beta, method);
    u.param.mul_(1.0 - lr * weight_decay).add_(update.reshape(u.param.sizes()), -lr);
  }
}

bool Muon::applies_grad_scale(const ParamUpdate& u) const {
  const bool muon = !u.state.tensors.empty() && u.state.tensors.front().first == "momentum_buffer";
  return !muon && adam_->applies_grad_scale(u);
}

}  // namespace deepspeed::optim

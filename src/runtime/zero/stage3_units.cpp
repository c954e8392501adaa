// Unit discovery and Sequential interception (see stage3_units.h).
#include "runtime/zero/stage3_units.h"

#include <type_traits>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include "deepspeed/zero3.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

using torch::nn::AnyModule;
using torch::nn::AnyModulePlaceholder;
using torch::nn::AnyValue;
using Content = std::unique_ptr<AnyModulePlaceholder>;

// See Note [Sequential interception]: a standard-layout object and its first member are
// pointer-interconvertible, so this cast is well defined while these hold.
static_assert(std::is_standard_layout<AnyModule>::value, "AnyModule layout changed");
static_assert(sizeof(AnyModule) == sizeof(Content), "AnyModule layout changed");

Content& content_of(AnyModule& m) { return *reinterpret_cast<Content*>(&m); }

class InterceptingHolder final : public AnyModulePlaceholder {
 public:
  explicit InterceptingHolder(Content inner)
      : AnyModulePlaceholder(typeid(InterceptingHolder)), inner_(std::move(inner)) {}

  AnyValue forward(std::vector<AnyValue>&& arguments) override {
    std::shared_ptr<torch::nn::Module> module = inner_->ptr();
    auto call = zero::detail::enter_unit(*module);
    if (!call) return inner_->forward(std::move(arguments));
    try {
      for (auto& a : arguments) {
        if (auto* t = a.try_get<at::Tensor>()) *t = zero::detail::track_input(call, *t);
      }
      AnyValue out = inner_->forward(std::move(arguments));
      std::vector<at::Tensor> tensors;
      if (auto* t = out.try_get<at::Tensor>()) tensors.push_back(*t);
      zero::detail::exit_unit(call, tensors);
      return out;
    } catch (...) {
      zero::detail::abort_unit(call);
      throw;
    }
  }
  std::shared_ptr<torch::nn::Module> ptr() override { return inner_->ptr(); }
  // Copies and clones are new models: they get the plain holder.
  Content copy() const override { return inner_->copy(); }
  Content clone_module(c10::optional<torch::Device> device) const override {
    return inner_->clone_module(device);
  }
  Content take_inner() { return std::move(inner_); }

 private:
  Content inner_;
};

void walk(const std::string& name, const std::shared_ptr<torch::nn::Module>& module,
          UnitDiscovery& out, std::set<const torch::nn::Module*>& seen);

void add_unit(const std::string& name, const std::shared_ptr<torch::nn::Module>& module,
              const std::shared_ptr<torch::nn::SequentialImpl>& parent, UnitDiscovery& out,
              std::set<const torch::nn::Module*>& seen) {
  if (!seen.insert(module.get()).second) return;  // a shared submodule is one unit
  out.units.push_back(FoundUnit{name, module, parent});
}

std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

void walk(const std::string& name, const std::shared_ptr<torch::nn::Module>& module,
          UnitDiscovery& out, std::set<const torch::nn::Module*>& seen) {
  if (dynamic_cast<const zero::UnitBase*>(module.get()) != nullptr) {
    add_unit(name, module, nullptr, out, seen);
    return;
  }
  for (const auto& p : module->named_parameters(/*recurse=*/false)) {
    out.outside_units.insert(p.value().unsafeGetTensorImpl());
  }
  auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module);
  for (const auto& child : module->named_children()) {
    const std::string child_name = join(name, child.key());
    const bool is_sequential =
        std::dynamic_pointer_cast<torch::nn::SequentialImpl>(child.value()) != nullptr;
    if (sequential && !is_sequential &&
        dynamic_cast<const zero::UnitBase*>(child.value().get()) == nullptr) {
      add_unit(child_name, child.value(), sequential, out, seen);
    } else {
      walk(child_name, child.value(), out, seen);
    }
  }
}

}  // namespace

UnitDiscovery discover_units(const std::shared_ptr<torch::nn::Module>& root,
                             const std::string& root_name) {
  UnitDiscovery out;
  std::set<const torch::nn::Module*> seen;
  walk(root_name, root, out, seen);
  return out;
}

void SequentialInterception::intercept(
    const std::shared_ptr<torch::nn::SequentialImpl>& sequential, const torch::nn::Module* child) {
  for (auto it = sequential->begin(); it != sequential->end(); ++it) {
    Content& content = content_of(*it);
    if (!content || content->ptr().get() != child) continue;
    if (dynamic_cast<InterceptingHolder*>(content.get()) != nullptr) continue;
    auto holder = std::make_unique<InterceptingHolder>(std::move(content));
    swapped_.push_back(Swapped{sequential, holder.get()});
    content = std::move(holder);
  }
}

SequentialInterception::~SequentialInterception() {
  for (auto& s : swapped_) {
    for (auto it = s.sequential->begin(); it != s.sequential->end(); ++it) {
      Content& content = content_of(*it);
      if (content.get() != s.holder) continue;
      content = static_cast<InterceptingHolder*>(content.get())->take_inner();
    }
  }
}

}  // namespace deepspeed::runtime

#include "nn/module_surgery.h"

namespace deepspeed::nn {
namespace {

using TensorDict = torch::OrderedDict<std::string, at::Tensor>;

// Module::parameters_ is protected: a derived class may name it, and the pointer to member it
// names applies to any Module.
struct ParameterAccess : torch::nn::Module {
  static constexpr TensorDict torch::nn::Module::*kParameters = &ParameterAccess::parameters_;
};

// Module::buffers_ is private. Access checking does not apply to the template arguments of an
// explicit instantiation ([temp.spec]/6), so instantiating Steal with the member pointer lets
// its friend function hand that pointer out.
TensorDict torch::nn::Module::*buffers_member();
template <TensorDict torch::nn::Module::*Member>
struct Steal {
  friend TensorDict torch::nn::Module::*buffers_member() { return Member; }
};
template struct Steal<&torch::nn::Module::buffers_>;

bool erase_from(TensorDict& dict, const std::string& name) {
  if (dict.find(name) == nullptr) return false;
  dict.erase(name);
  return true;
}

}  // namespace

bool erase_parameter(torch::nn::Module& module, const std::string& name) {
  return erase_from(module.*ParameterAccess::kParameters, name);
}

bool erase_buffer(torch::nn::Module& module, const std::string& name) {
  return erase_from(module.*buffers_member(), name);
}

bool erase_child(torch::nn::Module& module, const std::string& name) {
  if (module.named_children().find(name) == nullptr) return false;
  module.unregister_module(name);
  return true;
}

}  // namespace deepspeed::nn

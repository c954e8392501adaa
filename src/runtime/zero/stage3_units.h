// Which submodules are ZeRO-3 units (see deepspeed/zero3.h), and the interception of
// torch::nn::Sequential children, whose forward the Sequential calls through an AnyModule.
//
// Note [Sequential interception]: a Sequential calls each child through the AnyModule it
// stores, and the AnyModule through its type-erased holder. We swap that holder for one that
// brackets the child's forward with the unit calls of zero3.h and forwards everything else
// (ptr(), copy, clone) to the original, which it keeps and gives back when the engine goes.
// The AnyModule's only member is that holder (a standard-layout class, checked at compile
// time), which is how we reach it. While swapped, seq->at<T>(i) / ptr<T>(i) refuse (the
// holder's type is ours); seq[i], ptr(i), named_children() and parameters are unchanged.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace c10 {
struct TensorImpl;
}
namespace torch::nn {
class SequentialImpl;
}

namespace deepspeed::runtime {

struct FoundUnit {
  std::string name;  // its path in the model ("" for the root)
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<torch::nn::SequentialImpl> sequential;  // the parent Sequential, if a child
};

struct UnitDiscovery {
  std::vector<FoundUnit> units;
  /// Parameters registered (directly) by a module that is in no unit: they stay gathered.
  std::set<const c10::TensorImpl*> outside_units;
};

/// Walks the model: zero::Unit modules and Sequential children (through nested Sequentials)
/// are units; nothing below a unit is walked further.
UnitDiscovery discover_units(const std::shared_ptr<torch::nn::Module>& root,
                             const std::string& root_name = "");

/// Swaps the AnyModule holders of Sequential children for intercepting ones, and back on
/// destruction. See Note [Sequential interception].
class SequentialInterception {
 public:
  SequentialInterception() = default;
  ~SequentialInterception();
  SequentialInterception(const SequentialInterception&) = delete;
  SequentialInterception& operator=(const SequentialInterception&) = delete;

  /// Intercepts the call of `child` by `sequential`.
  void intercept(const std::shared_ptr<torch::nn::SequentialImpl>& sequential,
                 const torch::nn::Module* child);

 private:
  struct Swapped {
    std::shared_ptr<torch::nn::SequentialImpl> sequential;
    const void* holder = nullptr;  // ours, to find it again
  };
  std::vector<Swapped> swapped_;
};

}  // namespace deepspeed::runtime

// snapshot_for_save: the rules mirror the pickle writer's write_tensor (pickle_writer.cpp), so
// that what it shares or copies out is shared or copied out alike in the snapshot.
#include "runtime/checkpoint/value_snapshot.h"

#include <unordered_map>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/python_value.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

class Snapshot {
 public:
  explicit Snapshot(std::string where) : where_(std::move(where)) {}

  IValue copy(const IValue& value) {
    if (value.isTensor()) return copy_tensor(value.toTensor());
    if (value.isList()) {
      c10::impl::GenericList list = value.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const IValue& item : list) out.push_back(copy(item));
      return out;
    }
    if (value.isGenericDict()) {
      c10::impl::GenericDict dict = value.toGenericDict();
      c10::impl::GenericDict out(dict.keyType(), dict.valueType());
      out.reserve(dict.size());
      for (const auto& entry : dict) out.insert(entry.key(), copy(entry.value()));
      return out;
    }
    if (value.isTuple()) {
      std::vector<IValue> items;
      for (const IValue& item : value.toTupleRef().elements()) items.push_back(copy(item));
      auto type = value.toTupleRef().type();
      if (type && type->name()) return c10::ivalue::Tuple::createNamed(std::move(items), type);
      return c10::ivalue::Tuple::create(std::move(items));
    }
    if (auto object = as_python_object(value)) {
      for (IValue& arg : object->args) arg = copy(arg);
      object->state = copy(IValue(object->state)).toGenericDict();
      return detail::python_value_of(std::move(*object));
    }
    return value;  // None, bool, int, float, str: immutable
  }

 private:
  at::Tensor copy_tensor(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    auto known = tensors_.find(tensor.unsafeGetTensorImpl());
    if (known != tensors_.end()) return known->second;
    DS_CHECK(tensor.layout() == at::kStrided && !tensor.is_quantized(), NotSupportedError,
             "checkpoint value ", where_, ": only dense tensors can be saved, found layout ",
             tensor.layout());
    const bool covers_storage = tensor.is_contiguous() && tensor.storage_offset() == 0 &&
                                tensor.storage().nbytes() ==
                                    static_cast<size_t>(tensor.numel()) * tensor.element_size();
    at::Tensor out;
    if (covers_storage) {
      // One copy of the storage for every tensor covering it (under any dtype).
      const c10::StorageImpl* id = tensor.storage().unsafeGetStorageImpl();
      auto storage = storages_.find(id);
      if (storage == storages_.end()) {
        at::Tensor bytes = at::empty({static_cast<int64_t>(tensor.storage().nbytes())},
                                     at::TensorOptions().dtype(at::kByte));
        if (bytes.numel() > 0) {
          at::Tensor src = at::empty({0}, tensor.options().dtype(at::kByte))
                               .set_(tensor.storage(), 0, {bytes.numel()}, {1});
          bytes.copy_(src);
        }
        storage = storages_.emplace(id, bytes.storage()).first;
      }
      out = at::empty({0}, at::TensorOptions().dtype(tensor.dtype()))
                .set_(storage->second, 0, tensor.sizes(), tensor.strides());
    } else {
      out = tensor.detach().to(at::TensorOptions().device(at::kCPU).dtype(tensor.scalar_type()),
                               /*non_blocking=*/false, /*copy=*/true,
                               at::MemoryFormat::Contiguous);
    }
    tensors_.emplace(tensor.unsafeGetTensorImpl(), out);
    return out;
  }

  std::string where_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> tensors_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages_;
};

}  // namespace

IValue snapshot_for_save(const IValue& value, const std::string& where) {
  return Snapshot(where).copy(value);
}

}  // namespace deepspeed::checkpoint

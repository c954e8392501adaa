// The pickler behind save(): the opcodes CPython's protocol-2 pickler emits for the same Python
// values, restricted to those torch.load(weights_only=True) accepts unless the value holds
// Python objects (Note [Python values in an IValue]). Tensors follow torch.save: a call of
// torch._utils._rebuild_tensor_v2 on a persistent ('storage', torch.<T>Storage, key, 'cpu',
// numel) reference, the storage bytes going to a separate zip record.
#include "runtime/checkpoint/pickle_writer.h"

#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/pickle_opcodes.h"
#include "runtime/checkpoint/python_value.h"
#include "runtime/checkpoint/storage_types.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files store little-endian data; a big-endian host would need swaps");

using c10::IValue;

class Pickler {
 public:
  explicit Pickler(const StorageSink& sink) : sink_(sink) {}

  std::string run(const IValue& value) {
    op(Op::PROTO);
    out_.push_back(2);
    write(value, "<root>");
    op(Op::STOP);
    return std::move(out_);
  }

 private:
  void op(Op o) { out_.push_back(static_cast<char>(o)); }
  void raw(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  template <typename T>
  void little_endian(T v) {
    raw(&v, sizeof v);
  }

  void write_int(int64_t v) {
    if (v >= 0 && v < 256) {
      op(Op::BININT1);
      out_.push_back(static_cast<char>(v));
    } else if (v >= 0 && v < 65536) {
      op(Op::BININT2);
      little_endian(static_cast<uint16_t>(v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op(Op::BININT);
      little_endian(static_cast<int32_t>(v));
    } else {
      // LONG1: the shortest little-endian two's complement that keeps the sign.
      unsigned char bytes[8];
      std::memcpy(bytes, &v, 8);
      int n = 8;
      while (n > 1 && ((bytes[n - 1] == 0x00 && !(bytes[n - 2] & 0x80)) ||
                       (bytes[n - 1] == 0xff && (bytes[n - 2] & 0x80)))) {
        --n;
      }
      op(Op::LONG1);
      out_.push_back(static_cast<char>(n));
      raw(bytes, n);
    }
  }

  void write_double(double v) {
    op(Op::BINFLOAT);
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int shift = 56; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(bits >> shift));
  }

  void write_string(const std::string& s) {
    op(Op::BINUNICODE);
    little_endian(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }

  void write_global(const std::string& path) {
    auto dot = path.rfind('.');
    op(Op::GLOBAL);
    out_ += path.substr(0, dot) + "\n" + path.substr(dot + 1) + "\n";
  }

  void write_memo_put() {
    if (next_memo_ < 256) {
      op(Op::BINPUT);
      out_.push_back(static_cast<char>(next_memo_));
    } else {
      op(Op::LONG_BINPUT);
      little_endian(next_memo_);
    }
    ++next_memo_;
  }

  void write_memo_get(uint32_t index) {
    if (index < 256) {
      op(Op::BINGET);
      out_.push_back(static_cast<char>(index));
    } else {
      op(Op::LONG_BINGET);
      little_endian(index);
    }
  }

  void write_tuple(const std::vector<IValue>& items, const std::string& where) {
    if (items.empty()) {
      op(Op::EMPTY_TUPLE);
      return;
    }
    if (items.size() > 3) op(Op::MARK);
    for (size_t i = 0; i < items.size(); ++i) write(items[i], where + "[" + std::to_string(i) + "]");
    static const Op by_size[] = {Op::EMPTY_TUPLE, Op::TUPLE1, Op::TUPLE2, Op::TUPLE3};
    op(items.size() > 3 ? Op::TUPLE : by_size[items.size()]);
  }

  void write_int_tuple(c10::IntArrayRef values) {
    std::vector<IValue> items(values.begin(), values.end());
    write_tuple(items, "");
  }

  void write_list(c10::ArrayRef<IValue> items, const std::string& where) {
    op(Op::EMPTY_LIST);
    if (items.empty()) return;
    op(Op::MARK);
    for (size_t i = 0; i < items.size(); ++i) write(items[i], where + "[" + std::to_string(i) + "]");
    op(Op::APPENDS);
  }

  void write_dict(const Dict& dict, const std::string& where) {
    op(Op::EMPTY_DICT);
    if (dict.empty()) return;
    op(Op::MARK);
    for (const auto& entry : dict) {
      const IValue& key = entry.key();
      DS_CHECK(key.isString() || key.isInt(), NotSupportedError, "checkpoint value ", where,
               ": dict keys must be str or int, found a ", key.tagKind());
      write(key, where);
      write(entry.value(), where + "." + (key.isString() ? key.toStringRef()
                                                          : std::to_string(key.toInt())));
    }
    op(Op::SETITEMS);
  }

  // Python object forms, see Note [Python values in an IValue].
  bool write_python_value(const IValue& value, const std::string& where) {
    if (value.isTuple()) {
      if (!is_torch_size(value)) return false;
      write_global(kSizeName);  // torch.Size((d0, d1, ...))
      write_tuple(value.toTupleRef().elements().vec(), where);
      op(Op::TUPLE1);
      op(Op::REDUCE);
      return true;
    }
    auto object = as_python_object(value);
    if (!object) return false;
    if (is_python_set(value)) {
      // EMPTY_SET (+ ADDITEMS): an empty set stays loadable with weights_only=True.
      op(Op::EMPTY_SET);
      auto items = object->args[0].toListRef();
      if (!items.empty()) {
        op(Op::MARK);
        for (const auto& item : items) write(item, where);
        op(Op::ADDITEMS);
      }
      return true;
    }
    write_global(object->class_path);
    if (object->is_global) return true;
    write_tuple(object->args, where + ".args");
    if (object->state.empty()) {
      op(Op::REDUCE);
    } else {
      op(Op::NEWOBJ);
      write_dict(object->state, where);
      op(Op::BUILD);
    }
    return true;
  }

  void write_tensor(const at::Tensor& tensor, const std::string& where) {
    if (!tensor.defined()) {
      op(Op::NONE);  // Python has no undefined tensor
      return;
    }
    auto memo = tensor_memo_.find(tensor.unsafeGetTensorImpl());
    if (memo != tensor_memo_.end()) {
      write_memo_get(memo->second);
      return;
    }
    DS_CHECK(tensor.layout() == at::kStrided && !tensor.is_quantized(), NotSupportedError,
             "checkpoint value ", where, ": only dense tensors can be saved, found layout ",
             tensor.layout());
    const std::string storage_class = storage_class_name(tensor.scalar_type(), where);
    const int64_t item_size = static_cast<int64_t>(tensor.element_size());

    // A tensor that exactly covers its storage is written as it is, its storage once however
    // many tensors share it; any other view is copied out, so that a parameter viewing a flat
    // buffer does not drag the whole buffer into the file (DeepSpeed clones for the same reason).
    const bool covers_storage = tensor.is_contiguous() && tensor.storage_offset() == 0 &&
                                tensor.storage().nbytes() ==
                                    static_cast<size_t>(tensor.numel() * item_size);
    at::Tensor data = covers_storage ? tensor : tensor.clone(at::MemoryFormat::Contiguous);
    std::string key;
    const StorageId id{tensor.storage().unsafeGetStorageImpl(), tensor.scalar_type()};
    auto known = covers_storage ? storage_keys_.find(id) : storage_keys_.end();
    if (known != storage_keys_.end()) {
      key = known->second;
    } else {
      key = std::to_string(next_storage_key_++);
      if (covers_storage) storage_keys_[id] = key;
      at::Tensor host = data.device().is_cpu() ? data : data.to(at::kCPU);
      static const char kEmpty = 0;
      sink_(key, host.numel() ? host.data_ptr() : &kEmpty, host.numel() * item_size);
    }

    write_global("torch._utils._rebuild_tensor_v2");
    op(Op::MARK);
    {  // the storage: a persistent id
      op(Op::MARK);
      write_string("storage");
      write_global("torch." + storage_class);
      write_string(key);
      write_string("cpu");
      write_int(data.numel());
      op(Op::TUPLE);
      op(Op::BINPERSID);
    }
    write_int(0);  // storage offset
    write_int_tuple(data.sizes());
    write_int_tuple(data.strides());
    op(Op::NEWFALSE);  // requires_grad: state dicts hold detached tensors
    write_global("collections.OrderedDict");  // backward hooks: OrderedDict()
    op(Op::EMPTY_TUPLE);
    op(Op::REDUCE);
    op(Op::TUPLE);
    op(Op::REDUCE);
    tensor_memo_[tensor.unsafeGetTensorImpl()] = next_memo_;
    write_memo_put();
  }

  void write(const IValue& value, const std::string& where) {
    // See Note [Nesting depth of loaded values]: deeper would not load again, and this
    // recursion could overflow the stack.
    DS_CHECK(depth_ < kMaxNestingDepth, NotSupportedError, "checkpoint value ",
             where.substr(0, 60), "...: nested deeper than ", kMaxNestingDepth,
             " levels, which the loader (ours, and torch.load for the pickles CPython writes) "
             "refuses");
    ++depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    if (value.isNone()) {
      op(Op::NONE);
    } else if (value.isBool()) {
      op(value.toBool() ? Op::NEWTRUE : Op::NEWFALSE);
    } else if (value.isInt()) {
      write_int(value.toInt());
    } else if (value.isDouble()) {
      write_double(value.toDouble());
    } else if (value.isString()) {
      write_string(value.toStringRef());
    } else if (value.isTensor()) {
      write_tensor(value.toTensor(), where);
    } else if (value.isTuple()) {
      if (!write_python_value(value, where)) write_tuple(value.toTupleRef().elements().vec(), where);
    } else if (value.isCapsule() && write_python_value(value, where)) {
      // a python_object / python_global / python_set
    } else if (value.isList()) {
      write_list(value.toListRef(), where);
    } else if (value.isGenericDict()) {
      write_dict(value.toGenericDict(), where);
    } else {
      DS_CHECK(false, NotSupportedError, "checkpoint value ", where, ": a ", value.tagKind(),
               " has no Python equivalent in a checkpoint (expected None, bool, int, float, str, "
               "tensor, list, tuple or dict)");
    }
  }

  const StorageSink& sink_;
  std::string out_;
  int depth_ = 0;  // of write() calls
  uint32_t next_memo_ = 0;
  int64_t next_storage_key_ = 0;
  std::unordered_map<const c10::TensorImpl*, uint32_t> tensor_memo_;
  // A storage is shared only under one dtype (Python refuses two dtypes over one storage).
  using StorageId = std::pair<const c10::StorageImpl*, at::ScalarType>;
  std::map<StorageId, std::string> storage_keys_;
};

}  // namespace

std::string pickle_value(const IValue& value, const StorageSink& sink) {
  return Pickler(sink).run(value);
}

}  // namespace deepspeed::checkpoint::detail

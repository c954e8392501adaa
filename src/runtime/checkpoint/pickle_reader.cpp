// The unpickler behind load(): a stack machine over the opcodes CPython's pickler emits for
// torch.save (protocol 2, and protocol 4 ones), building c10::IValues as described in Note
// [Python values in an IValue]. Unlike LibTorch's own Unpickler it accepts what DeepSpeed
// pickles besides tensors: torch.Size, sets, OrderedDict with _metadata, enum values, class
// instances such as the loss scaler, and numpy's numeric arrays and scalars (numpy_values.h),
// without executing anything.
#include "runtime/checkpoint/pickle_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/numpy_values.h"
#include "runtime/checkpoint/pickle_opcodes.h"
#include "runtime/checkpoint/python_value.h"
#include "runtime/checkpoint/storage_types.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

using c10::IValue;
using List = c10::impl::GenericList;

// Note [Nesting depth of loaded values]
// Anything recursive over a loaded value (its destructor first of all, then printing, JSON
// conversion, saving it again) uses one stack frame or more per level, so a handwritten pickle
// of 10^6 nested lists (2 MB) would overflow the stack. The unpickler therefore refuses values
// nested deeper than kMaxNestingDepth, before building them: torch.save cannot write deeper
// values anyway (CPython's pickler stops at its recursion limit, 1000 by default). The height
// of a container is known when it is placed inside another because a placed container is
// sealed: CPython's pickler finishes a list, dict or object before placing it, and changing
// one afterwards (only recursive structures do) is refused, so no height can grow unseen.
// The pickler refuses to write deeper values (kMaxNestingDepth is in python_value.h).

bool is_container(const IValue& v) {
  return v.isList() || v.isGenericDict() || v.isTuple() || v.isCapsule();
}

std::optional<std::string> global_path(const IValue& v) {
  auto object = as_python_object(v);
  if (object && object->is_global) return object->class_path;
  return std::nullopt;
}

class Unpickler {
 public:
  Unpickler(const char* data, size_t size, const StorageSource& storages, std::string source)
      : data_(data), size_(size), storages_(storages), source_(std::move(source)) {}

  IValue run() {
    while (true) {
      const size_t at = pos_;
      const auto code = static_cast<Op>(read_u8());
      try {
        if (code == Op::STOP) {
          check(stack_.size() == 1, "STOP with ", stack_.size(), " values on the stack");
          return stack_.back();
        }
        step(code);
      } catch (const CheckpointError&) {
        throw;
      } catch (const std::exception& e) {  // c10 errors from tensor/dict construction
        fail_at(at, e.what());
      }
    }
  }

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& what) {
    throw CheckpointError(::deepspeed::detail::str_cat(source_, ": pickle data at byte ", at,
                                                       ": ", what));
  }
  template <typename... Parts>
  void check(bool cond, const Parts&... parts) {
    if (!cond) fail_at(pos_, ::deepspeed::detail::str_cat(parts...));
  }

  // --- raw input -------------------------------------------------------------------------
  const char* take(size_t n) {
    if (n > size_ - pos_) {
      fail_at(pos_, ::deepspeed::detail::str_cat("truncated: needs ", n, " more bytes, ",
                                                 size_ - pos_, " left"));
    }
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint8_t read_u8() { return static_cast<uint8_t>(*take(1)); }
  template <typename T>
  T read_le() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string read_bytes(uint64_t n) { return std::string(take(n), n); }
  std::string read_line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    check(nl != nullptr, "truncated: unterminated GLOBAL name");
    const size_t n = static_cast<const char*>(nl) - (data_ + pos_);
    std::string line(data_ + pos_, n);
    pos_ += n + 1;
    return line;
  }
  int64_t read_long(size_t n) {
    check(n <= 8, "an integer of ", n, " bytes does not fit in int64");
    const char* p = take(n);
    if (n == 0) return 0;
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    if (n < 8 && (static_cast<uint8_t>(p[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }

  // --- nesting (Note [Nesting depth of loaded values]) --------------------------------------
  struct ContainerRecord {
    IValue keep;  // keeps the address from being reused while it is recorded
    int height = 1;
    bool sealed = false;
  };
  int height_of(const IValue& v) const {
    if (!is_container(v)) return 0;
    auto it = containers_.find(v.internalToPointer());
    return it == containers_.end() ? 1 : it->second.height;
  }
  ContainerRecord& record_of(const IValue& v) {
    auto [it, inserted] = containers_.try_emplace(v.internalToPointer());
    if (inserted) it->second.keep = v;
    return it->second;
  }
  void check_height(int height) {
    check(height <= kMaxNestingDepth, "values nested deeper than ", kMaxNestingDepth,
          " levels (the limit; torch.save cannot write deeper ones): a corrupt or handcrafted "
          "file");
  }
  // `child` goes inside `parent` (APPEND, SETITEM, BUILD).
  void place(const IValue& parent, const IValue& child) {
    if (!is_container(child)) return;
    check(!child.isSameIdentity(parent), "a ", parent.tagKind(),
          " placed inside itself: recursive structures are not supported");
    ContainerRecord& p = record_of(parent);
    check(!p.sealed, "a ", parent.tagKind(),
          " is changed after it was placed inside another value (a recursive structure, or "
          "not written by pickle): not supported");
    const int h = height_of(child) + 1;
    check_height(h);
    record_of(child).sealed = true;
    p.height = std::max(p.height, h);
  }
  // `made` was just built from `parts` (a tuple, list, dict, object or set).
  IValue made(IValue value, const std::vector<IValue>& parts) {
    if (!is_container(value)) return value;
    int h = height_of(value);
    for (const auto& part : parts) {
      if (!is_container(part) || part.isSameIdentity(value)) continue;
      h = std::max(h, height_of(part) + 1);
      check_height(h);
      record_of(part).sealed = true;
    }
    record_of(value).height = h;
    return value;
  }

  // --- stack -----------------------------------------------------------------------------
  void push(IValue v) { stack_.push_back(std::move(v)); }
  IValue pop() {
    check(stack_.size() > mark_floor(), "stack underflow");
    IValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  IValue& top() {
    check(stack_.size() > mark_floor(), "stack underflow");
    return stack_.back();
  }
  size_t mark_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<IValue> pop_mark() {
    check(!marks_.empty(), "no MARK to pop to");
    const size_t start = marks_.back();
    marks_.pop_back();
    std::vector<IValue> items(std::make_move_iterator(stack_.begin() + start),
                              std::make_move_iterator(stack_.end()));
    stack_.resize(start);
    return items;
  }
  void memo_put(uint32_t index) { memo_[index] = top(); }
  void memo_get(uint32_t index) {
    auto it = memo_.find(index);
    check(it != memo_.end(), "memo entry ", index, " read before it was written");
    push(it->second);
  }

  void set_item(IValue& target, IValue key, IValue value) {
    place(target, key);
    place(target, value);
    if (target.isGenericDict()) {
      target.toGenericDict().insert_or_assign(std::move(key), std::move(value));
      return;
    }
    auto object = as_python_object(target);
    check(object && !object->is_global, "SETITEM on a ", target.tagKind(), ", expected a dict");
    object->state.insert_or_assign(std::move(key), std::move(value));  // a dict subclass
  }
  void append(IValue& target, IValue item) {
    check(target.isList(), "APPEND on a ", target.tagKind(), ", expected a list");
    place(target, item);
    target.toList().push_back(std::move(item));
  }

  // --- tensors ---------------------------------------------------------------------------
  IValue persistent_load(const IValue& pid) {
    check(pid.isTuple() && pid.toTupleRef().elements().size() >= 5,
          "persistent id is not a ('storage', type, key, location, numel) tuple");
    const auto& e = pid.toTupleRef().elements();
    check(e[0].isString() && e[0].toStringRef() == "storage", "persistent id kind is not 'storage'");
    auto type = global_path(e[1]);
    check(type.has_value() && e[2].isString() && e[4].isInt(), "malformed storage reference");
    const std::string class_name = type->substr(type->rfind('.') + 1);
    auto dtype = dtype_of_storage_class(class_name);
    check(dtype.has_value(), "unknown storage class ", *type);
    const std::string& key = e[2].toStringRef();
    auto known = storages_by_key_.find(key);
    if (known == storages_by_key_.end()) {
      const int64_t numel = e[4].toInt();
      check(numel >= 0 && static_cast<uint64_t>(numel) <=
                              std::numeric_limits<uint64_t>::max() / c10::elementSize(*dtype),
            "storage ", key, " has an impossible element count ", numel);
      const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(*dtype);
      known = storages_by_key_.emplace(key, std::make_pair(storages_(key, nbytes), *dtype)).first;
    }
    check(known->second.second == *dtype, "storage ", key, " is read as two different dtypes");
    storage_dtypes_[known->second.first.unsafeGetStorageImpl()] = *dtype;
    return IValue(known->second.first);
  }

  std::vector<int64_t> int_tuple(const IValue& v, const char* what) {
    check(v.isTuple(), what, " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& e : v.toTupleRef().elements()) {
      check(e.isInt(), what, " holds a non-int");
      out.push_back(e.toInt());
    }
    return out;
  }

  IValue rebuild_tensor(const std::vector<IValue>& args) {
    check(args.size() >= 4 && args[0].isStorage() && args[1].isInt(),
          "_rebuild_tensor arguments are not (storage, offset, size, stride, ...)");
    c10::Storage storage = args[0].toStorage();
    const at::ScalarType dtype = storage_dtypes_.at(storage.unsafeGetStorageImpl());
    const int64_t offset = args[1].toInt();
    const auto sizes = int_tuple(args[2], "tensor size");
    const auto strides = int_tuple(args[3], "tensor stride");
    check(sizes.size() == strides.size() && offset >= 0, "tensor size/stride do not match");
    int64_t last = offset;  // the last element the view touches
    bool empty = false;
    for (size_t i = 0; i < sizes.size(); ++i) {
      check(sizes[i] >= 0 && strides[i] >= 0, "negative size or stride");
      empty |= sizes[i] == 0;
      if (sizes[i] > 0) last += (sizes[i] - 1) * strides[i];
    }
    const size_t item = c10::elementSize(dtype);
    check(empty || static_cast<size_t>(last + 1) * item <= storage.nbytes(), "a tensor of size ",
          c10::IntArrayRef(sizes), " at offset ", offset, " needs ", (last + 1) * item,
          " bytes, its storage record has ", storage.nbytes(), " (truncated file?)");
    at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
    t.set_(storage, offset, sizes, strides);
    return IValue(t);
  }

  // --- calls -----------------------------------------------------------------------------
  // What `callable(*args)` builds. Only known constructors run; an unknown class becomes a
  // python_object (Note [Python values in an IValue]); nothing of the file's choosing executes.
  IValue call(const std::string& callable, std::vector<IValue> args) {
    if (callable == "torch._utils._rebuild_tensor_v2" || callable == "torch._utils._rebuild_tensor") {
      return rebuild_tensor(args);
    }
    if (callable == "torch._utils._rebuild_parameter" ||
        callable == "torch._utils._rebuild_parameter_with_state" ||
        callable == "torch.nn.parameter.Parameter") {
      check(!args.empty() && args[0].isTensor(), "Parameter without tensor data");
      return args[0];
    }
    if (callable == "torch._tensor._rebuild_from_type_v2") {  // (func, type, args, state)
      check(args.size() >= 3 && args[2].isTuple(), "malformed _rebuild_from_type_v2");
      auto func = global_path(args[0]);
      check(func.has_value(), "_rebuild_from_type_v2 without a function");
      return call(*func, args[2].toTupleRef().elements().vec());
    }
    if (callable == "collections.OrderedDict" || callable == "collections.defaultdict" ||
        callable == "builtins.dict" || callable == "__builtin__.dict") {
      return new_dict();  // items follow through SETITEMS
    }
    if (callable == kSizeName) {
      check(args.size() == 1, "torch.Size takes one tuple");
      std::vector<int64_t> shape = args[0].isTuple() ? int_tuple(args[0], "torch.Size")
                                                     : shape_from_ivalue(args[0], source_);
      return torch_size(shape);
    }
    if (callable == "builtins.set" || callable == "__builtin__.set" ||
        callable == "builtins.frozenset" || callable == "__builtin__.frozenset") {
      List list(c10::AnyType::get());
      if (!args.empty()) {
        check(args[0].isList(), "set() of a ", args[0].tagKind());
        for (const auto& item : args[0].toListRef()) list.push_back(item);
      }
      return IValue(list);
    }
    if (callable == "_codecs.encode") {  // how protocol 2 stores Python 3 bytes
      check(args.size() == 2 && args[0].isString(), "malformed _codecs.encode");
      return IValue(latin1_bytes(args[0].toStringRef()));
    }
    if ((callable == "__builtin__.bytes" || callable == "builtins.bytes") && args.empty()) {
      return IValue(std::string());  // protocol 2's b'' (an empty numpy array's data)
    }
    if (callable == kNumpyDtype) return numpy_dtype(args);
    if (is_numpy_scalar_constructor(callable)) return numpy_scalar(args);
    if (is_numpy_array_constructor(callable)) return numpy_array_placeholder(args);
    check(callable.rfind("numpy.", 0) != 0, "numpy values of ", callable,
          " are not supported (numpy's numeric arrays and scalars are); save torch tensors");
    check(callable.rfind("torch._utils._rebuild", 0) != 0, callable,
          " (sparse, quantized or meta tensors) is not supported");
    return python_object(callable, std::move(args));
  }

  // _codecs.encode(text, 'latin1'): code points < 256 back to the bytes they stand for.
  std::string latin1_bytes(const std::string& utf8) {
    std::string out;
    for (size_t i = 0; i < utf8.size(); ++i) {
      const auto c = static_cast<unsigned char>(utf8[i]);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
      } else {
        check((c & 0xe0) == 0xc0 && i + 1 < utf8.size(), "bytes value is not latin-1");
        out.push_back(static_cast<char>(((c & 0x1f) << 6) | (utf8[++i] & 0x3f)));
      }
    }
    return out;
  }

  // An object whose BUILD makes a different value (a numpy array becomes a tensor): the
  // stack's and the memo's references to it now hold `value`.
  void replace_built(IValue& target, IValue value) {
    const IValue old = target;
    for (auto& entry : memo_) {
      if (entry.second.isSameIdentity(old)) entry.second = value;
    }
    target = std::move(value);
  }

  void build() {
    IValue state = pop();
    IValue& target = top();
    if (target.isGenericDict() || target.isTensor()) return;  // OrderedDict._metadata, Parameter
    auto object = as_python_object(target);
    check(object && !object->is_global, "BUILD on a ", target.tagKind());
    if (object->class_path == kNumpyDtype) return build_numpy_dtype(*object, state);
    if (object->class_path == kNumpyArray) return replace_built(target, numpy_array(state));
    auto merge = [&](const IValue& s) {
      if (s.isNone()) return;
      check(s.isGenericDict(), "object state is a ", s.tagKind(), ", expected a dict");
      for (const auto& entry : s.toGenericDict()) {
        place(target, entry.key());
        place(target, entry.value());
        object->state.insert_or_assign(entry.key(), entry.value());
      }
    };
    if (state.isTuple() && state.toTupleRef().elements().size() == 2) {  // (__dict__, slots)
      merge(state.toTupleRef().elements()[0]);
      merge(state.toTupleRef().elements()[1]);
    } else {
      merge(state);
    }
  }

  void step(Op code) {
    switch (code) {
      case Op::PROTO: read_u8(); break;
      case Op::FRAME: take(8); break;
      case Op::NONE: push(IValue()); break;
      case Op::NEWTRUE: push(IValue(true)); break;
      case Op::NEWFALSE: push(IValue(false)); break;
      case Op::BININT: push(IValue(static_cast<int64_t>(read_le<int32_t>()))); break;
      case Op::BININT1: push(IValue(static_cast<int64_t>(read_u8()))); break;
      case Op::BININT2: push(IValue(static_cast<int64_t>(read_le<uint16_t>()))); break;
      case Op::LONG1: push(IValue(read_long(read_u8()))); break;
      case Op::LONG4: push(IValue(read_long(read_le<uint32_t>()))); break;
      case Op::BINFLOAT: {
        const char* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p[i]);
        double v;
        std::memcpy(&v, &bits, 8);
        push(IValue(v));
        break;
      }
      case Op::SHORT_BINUNICODE:
      case Op::SHORT_BINSTRING:
      case Op::SHORT_BINBYTES: push(IValue(read_bytes(read_u8()))); break;
      case Op::BINUNICODE:
      case Op::BINBYTES: push(IValue(read_bytes(read_le<uint32_t>()))); break;
      case Op::BINSTRING: {
        const int32_t n = read_le<int32_t>();
        check(n >= 0, "negative string length");
        push(IValue(read_bytes(n)));
        break;
      }
      case Op::BINUNICODE8:
      case Op::BINBYTES8: push(IValue(read_bytes(read_le<uint64_t>()))); break;
      case Op::EMPTY_TUPLE: push(c10::ivalue::Tuple::create(std::vector<IValue>{})); break;
      case Op::TUPLE: {
        auto items = pop_mark();
        push(made(c10::ivalue::Tuple::create(items), items));
        break;
      }
      case Op::TUPLE1: {
        IValue a = pop();
        push(made(c10::ivalue::Tuple::create(a), {a}));
        break;
      }
      case Op::TUPLE2: {
        IValue b = pop(), a = pop();
        push(made(c10::ivalue::Tuple::create(a, b), {a, b}));
        break;
      }
      case Op::TUPLE3: {
        IValue c = pop(), b = pop(), a = pop();
        push(made(c10::ivalue::Tuple::create(a, b, c), {a, b, c}));
        break;
      }
      case Op::EMPTY_LIST:
      case Op::EMPTY_SET: push(IValue(List(c10::AnyType::get()))); break;
      case Op::LIST:
      case Op::FROZENSET: {
        List list(c10::AnyType::get());
        auto items = pop_mark();
        for (const auto& item : items) list.push_back(item);
        push(made(IValue(list), items));
        break;
      }
      case Op::APPEND: {
        IValue item = pop();
        append(top(), std::move(item));
        break;
      }
      case Op::APPENDS:
      case Op::ADDITEMS: {
        auto items = pop_mark();
        IValue& target = top();
        for (auto& item : items) append(target, std::move(item));
        break;
      }
      case Op::EMPTY_DICT: push(IValue(new_dict())); break;
      case Op::DICT: {
        auto items = pop_mark();
        check(items.size() % 2 == 0, "DICT with an odd number of items");
        Dict dict = new_dict();
        for (size_t i = 0; i < items.size(); i += 2) dict.insert_or_assign(items[i], items[i + 1]);
        push(made(IValue(dict), items));
        break;
      }
      case Op::SETITEM: {
        IValue value = pop(), key = pop();
        set_item(top(), std::move(key), std::move(value));
        break;
      }
      case Op::SETITEMS: {
        auto items = pop_mark();
        check(items.size() % 2 == 0, "SETITEMS with an odd number of items");
        IValue& target = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(target, items[i], items[i + 1]);
        break;
      }
      case Op::MARK: marks_.push_back(stack_.size()); break;
      case Op::POP: pop(); break;
      case Op::POP_MARK: pop_mark(); break;
      case Op::DUP: push(top()); break;
      case Op::BINPUT: memo_put(read_u8()); break;
      case Op::LONG_BINPUT: memo_put(read_le<uint32_t>()); break;
      case Op::MEMOIZE: memo_put(static_cast<uint32_t>(memo_.size())); break;
      case Op::BINGET: memo_get(read_u8()); break;
      case Op::LONG_BINGET: memo_get(read_le<uint32_t>()); break;
      case Op::GLOBAL: {
        std::string module = read_line();
        std::string name = read_line();
        push(python_global(module + "." + name));
        break;
      }
      case Op::STACK_GLOBAL: {
        IValue name = pop(), module = pop();
        check(module.isString() && name.isString(), "STACK_GLOBAL of non-strings");
        push(python_global(module.toStringRef() + "." + name.toStringRef()));
        break;
      }
      case Op::REDUCE:
      case Op::NEWOBJ: {
        IValue args = pop();
        IValue callable = pop();
        auto path = global_path(callable);
        check(path.has_value(), code == Op::REDUCE ? "REDUCE" : "NEWOBJ",
              " on something that is not a class or function");
        check(args.isTuple(), "call arguments are not a tuple");
        auto items = args.toTupleRef().elements().vec();
        push(made(call(*path, items), items));  // both: one object record
        break;
      }
      case Op::NEWOBJ_EX: {
        IValue kwargs = pop(), args = pop(), callable = pop();
        auto path = global_path(callable);
        check(path.has_value() && args.isTuple(), "malformed NEWOBJ_EX");
        check(!kwargs.isGenericDict() || kwargs.toGenericDict().empty(),
              "keyword arguments to ", *path, " are not supported");
        auto items = args.toTupleRef().elements().vec();
        push(made(call(*path, items), items));
        break;
      }
      case Op::BUILD: build(); break;
      case Op::BINPERSID: {
        IValue pid = pop();
        push(persistent_load(pid));
        break;
      }
      default:
        check(false, "unsupported pickle opcode 0x", std::hex, static_cast<int>(code),
              " (torch.save uses pickle protocol 2; text protocol 0 is not read)");
    }
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  const StorageSource& storages_;
  std::string source_;
  std::vector<IValue> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, IValue> memo_;
  std::map<std::string, std::pair<c10::Storage, at::ScalarType>> storages_by_key_;
  std::unordered_map<const c10::StorageImpl*, at::ScalarType> storage_dtypes_;
  std::unordered_map<const void*, ContainerRecord> containers_;
};

}  // namespace

IValue unpickle_value(const char* data, size_t size, const StorageSource& storages,
                      const std::string& source) {
  return Unpickler(data, size, storages, source).run();
}

}  // namespace deepspeed::checkpoint::detail

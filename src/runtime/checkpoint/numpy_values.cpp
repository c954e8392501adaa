#include "runtime/checkpoint/numpy_values.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <c10/util/complex.h>

#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

using c10::IValue;
using ::deepspeed::detail::str_cat;

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument(what); }

bool in_multiarray(const std::string& callable, const char* name) {
  return callable == str_cat("numpy.core.multiarray.", name) ||
         callable == str_cat("numpy._core.multiarray.", name);
}

// A numeric numpy type: kind 'b' (bool), 'i', 'u', 'f' or 'c' and its size in bytes.
struct NumpyType {
  std::string spec;  // "u4", for messages
  char kind = 0;
  size_t size = 0;
  bool big_endian = false;
};

NumpyType numpy_type_of(const IValue& value) {
  auto dtype = as_python_object(value);
  if (!dtype || dtype->class_path != kNumpyDtype || dtype->args.empty() ||
      !dtype->args[0].isString()) {
    refuse("a numpy value whose dtype is not a numpy.dtype");
  }
  NumpyType type;
  type.spec = dtype->args[0].toStringRef();
  const std::string& spec = type.spec;
  const bool sized = spec.size() >= 2 && std::all_of(spec.begin() + 1, spec.end(), ::isdigit);
  if (!sized || std::string("biufc").find(spec[0]) == std::string::npos) {
    refuse(str_cat("numpy dtype '", spec, "' is not supported (only bool, int, uint, float and "
                   "complex values and arrays are read)"));
  }
  type.kind = spec[0];
  type.size = std::stoul(spec.substr(1));
  const bool known = type.kind == 'b'   ? type.size == 1
                     : type.kind == 'f' ? type.size == 2 || type.size == 4 || type.size == 8
                     : type.kind == 'c' ? type.size == 8 || type.size == 16
                                        : type.size == 1 || type.size == 2 || type.size == 4 ||
                                              type.size == 8;
  if (!known) refuse(str_cat("numpy dtype '", spec, "' has no LibTorch equivalent"));
  if (dtype->state.contains("byteorder")) {
    type.big_endian = dtype->state.at("byteorder").toStringRef() == ">";
  }
  return type;
}

// The tensor type an array of `type` loads as: its own, or the signed type that holds every
// value of an unsigned one LibTorch 1.13 lacks.
at::ScalarType tensor_type(const NumpyType& type) {
  switch (type.kind) {
    case 'b': return at::kBool;
    case 'f': return type.size == 2 ? at::kHalf : type.size == 4 ? at::kFloat : at::kDouble;
    case 'c': return type.size == 8 ? at::kComplexFloat : at::kComplexDouble;
    case 'i':
      return type.size == 1 ? at::kChar : type.size == 2 ? at::kShort
             : type.size == 4 ? at::kInt : at::kLong;
    default: return type.size == 1 ? at::kByte : type.size == 2 ? at::kInt : at::kLong;
  }
}

// `raw` in little-endian order (x86 and ARM both are): each component reversed when the
// dtype is big-endian ('>'); a complex value has two components.
std::string little_endian(std::string raw, const NumpyType& type) {
  if (!type.big_endian) return raw;
  const size_t part = type.kind == 'c' ? type.size / 2 : type.size;
  for (size_t at = 0; at + part <= raw.size(); at += part) {
    std::reverse(raw.begin() + static_cast<std::ptrdiff_t>(at),
                 raw.begin() + static_cast<std::ptrdiff_t>(at + part));
  }
  return raw;
}

int64_t read_integer(const char* p, const NumpyType& type) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, type.size);
  if (type.kind == 'i' && type.size < 8 && (bits >> (8 * type.size - 1)) != 0) {
    bits |= ~uint64_t{0} << (8 * type.size);  // sign extension
  }
  if (type.kind == 'u' && bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    refuse(str_cat("numpy uint64 value ", bits, " does not fit in int64"));
  }
  return static_cast<int64_t>(bits);
}

const std::string& raw_bytes(const IValue& value, const char* what) {
  if (!value.isString()) refuse(str_cat(what, " is not bytes"));
  return value.toStringRef();
}

std::vector<int64_t> shape_of(const IValue& value) {
  if (!value.isTuple()) refuse("numpy array shape is not a tuple");
  std::vector<int64_t> shape;
  for (const auto& e : value.toTupleRef().elements()) {
    if (!e.isInt() || e.toInt() < 0) refuse("numpy array shape holds a non-size");
    shape.push_back(e.toInt());
  }
  return shape;
}

}  // namespace

bool is_numpy_scalar_constructor(const std::string& callable) {
  return in_multiarray(callable, "scalar");
}

bool is_numpy_array_constructor(const std::string& callable) {
  return in_multiarray(callable, "_reconstruct");
}

IValue numpy_dtype(const std::vector<IValue>& args) {
  if (args.empty() || !args[0].isString()) refuse("numpy.dtype() without a type string");
  return python_object(kNumpyDtype, args);
}

void build_numpy_dtype(PythonObject& dtype, const IValue& state) {
  if (!state.isTuple() || state.toTupleRef().elements().size() < 4) {
    refuse("numpy.dtype state is not a (version, byteorder, subarray, names, ...) tuple");
  }
  const auto& e = state.toTupleRef().elements();
  if (!e[1].isString()) refuse("numpy.dtype byte order is not a string");
  if (!e[2].isNone() || !e[3].isNone()) {
    refuse("numpy structured and subarray dtypes are not supported");
  }
  dtype.state.insert_or_assign("byteorder", e[1]);
}

IValue numpy_scalar(const std::vector<IValue>& args) {
  if (args.size() != 2) refuse("numpy scalar() takes (dtype, bytes)");
  const NumpyType type = numpy_type_of(args[0]);
  const std::string raw = little_endian(raw_bytes(args[1], "numpy scalar data"), type);
  if (raw.size() != type.size) {
    refuse(str_cat("numpy ", type.spec, " scalar holds ", raw.size(), " bytes"));
  }
  const char* p = raw.data();
  switch (type.kind) {
    case 'b': return IValue(*p != 0);
    case 'i':
    case 'u': return IValue(read_integer(p, type));
    case 'f': {
      if (type.size == 2) {
        c10::Half h;
        std::memcpy(&h, p, 2);
        return IValue(static_cast<double>(static_cast<float>(h)));
      }
      if (type.size == 4) {
        float f;
        std::memcpy(&f, p, 4);
        return IValue(static_cast<double>(f));
      }
      double d;
      std::memcpy(&d, p, 8);
      return IValue(d);
    }
    default: {
      if (type.size == 8) {
        float parts[2];
        std::memcpy(parts, p, 8);
        return IValue(c10::complex<double>(parts[0], parts[1]));
      }
      double parts[2];
      std::memcpy(parts, p, 16);
      return IValue(c10::complex<double>(parts[0], parts[1]));
    }
  }
}

IValue numpy_array_placeholder(const std::vector<IValue>& args) {
  auto cls = args.empty() ? std::nullopt : as_python_object(args[0]);
  if (!cls || !cls->is_global || cls->class_path != kNumpyArray) {
    refuse(str_cat("numpy array subclass ", cls ? cls->class_path : std::string("?"),
                   " is not supported (plain numpy.ndarray is)"));
  }
  return python_object(kNumpyArray);
}

at::Tensor numpy_array(const IValue& state) {
  if (!state.isTuple() || state.toTupleRef().elements().size() != 5) {
    refuse("numpy array state is not a (version, shape, dtype, fortran_order, data) tuple");
  }
  const auto& e = state.toTupleRef().elements();
  std::vector<int64_t> shape = shape_of(e[1]);
  const NumpyType type = numpy_type_of(e[2]);
  if (!e[3].isBool()) refuse("numpy array fortran_order is not a bool");
  const bool fortran = e[3].toBool();
  if (e[4].isList()) refuse("numpy object arrays are not supported");
  const std::string raw = little_endian(raw_bytes(e[4], "numpy array data"), type);

  // The element count, or more than the data could hold once it passes that.
  const uint64_t most = raw.size() / type.size;
  uint64_t numel = 1;
  for (int64_t d : shape) {
    const auto n = static_cast<uint64_t>(d);
    numel = n != 0 && numel > most / n ? most + 1 : numel * n;
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) numel = 0;
  if (numel * type.size != raw.size()) {
    refuse(str_cat("numpy ", type.spec, " array of shape ", c10::IntArrayRef(shape), " holds ",
                   raw.size(), " bytes"));
  }
  // Fortran order: the data is the transposed array's C order.
  std::vector<int64_t> layout(shape);
  if (fortran) std::reverse(layout.begin(), layout.end());
  at::Tensor t = at::empty(layout, at::TensorOptions().dtype(tensor_type(type)));
  if (type.kind == 'u' && type.size > 1) {
    auto* out = static_cast<char*>(t.data_ptr());
    const size_t out_size = t.element_size();
    for (size_t i = 0; i < numel; ++i) {
      const int64_t v = read_integer(raw.data() + i * type.size, type);
      if (out_size == 4) {
        const auto narrow = static_cast<int32_t>(v);
        std::memcpy(out + i * 4, &narrow, 4);
      } else {
        std::memcpy(out + i * 8, &v, 8);
      }
    }
  } else if (numel > 0) {
    std::memcpy(t.data_ptr(), raw.data(), raw.size());
    if (type.kind == 'b') {  // numpy's bools are any nonzero byte; LibTorch's must be 0 or 1
      auto* b = static_cast<uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < numel; ++i) b[i] = b[i] != 0;
    }
  }
  if (fortran && shape.size() > 1) {
    std::vector<int64_t> reversed(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      reversed[i] = static_cast<int64_t>(shape.size() - 1 - i);
    }
    t = t.permute(reversed).contiguous();
  }
  return t;
}

}  // namespace deepspeed::checkpoint::detail

// numpy's pickled dtypes, scalars and arrays, as the unpickler reads them. DeepSpeed's
// checkpoints carry a few (its data sampler saves numpy's generator state, an ndarray), and so
// do users' client states. Each is pickled as a call and then a BUILD of its state:
//   dtype:   numpy.dtype('i8', False, True)                        BUILD (3, '<', ...)
//   scalar:  numpy.core.multiarray.scalar(dtype, raw bytes)
//   ndarray: numpy.core.multiarray._reconstruct(ndarray, (0,), b'b') BUILD (1, shape, dtype,
//            fortran_order, raw bytes)
// (numpy 2 names the module numpy._core.multiarray.) An array loads as a Tensor, a scalar as an
// int, float, bool or complex; numpy's unsigned 16/32/64-bit types, which LibTorch 1.13 lacks,
// widen to int32/int64. Only numeric types are read: strings, objects, records, datetimes and
// numpy's other classes (generators, masked arrays) are refused by name.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"

namespace deepspeed::checkpoint::detail {

inline constexpr const char* kNumpyDtype = "numpy.dtype";
inline constexpr const char* kNumpyArray = "numpy.ndarray";

bool is_numpy_scalar_constructor(const std::string& callable);
bool is_numpy_array_constructor(const std::string& callable);

/// numpy.dtype(spec, align, copy): an object kNumpyDtype, its byte order set by BUILD.
c10::IValue numpy_dtype(const std::vector<c10::IValue>& args);
/// BUILD on a dtype: (version, byteorder, subarray, names, fields, elsize, alignment, flags).
void build_numpy_dtype(PythonObject& dtype, const c10::IValue& state);

/// scalar(dtype, raw): the value as an int, float, bool or complex.
c10::IValue numpy_scalar(const std::vector<c10::IValue>& args);

/// _reconstruct(ndarray, ...): an object kNumpyArray that BUILD turns into a tensor.
c10::IValue numpy_array_placeholder(const std::vector<c10::IValue>& args);
/// BUILD on an array: (version, shape, dtype, fortran_order, raw).
at::Tensor numpy_array(const c10::IValue& state);

}  // namespace deepspeed::checkpoint::detail

// Python's repr() of a float, so that CSV files read exactly as DeepSpeed's csv_monitor writes them
// (it formats values with str(), e.g. 0.001, 1e-05, 3.0).
#pragma once

#include <string>

namespace deepspeed::monitor::detail {

/// The shortest decimal that round-trips `value`, laid out as Python's float repr: fixed
/// notation for exponents -4 <= e < 16 (always with a ".0" when integral), else d.ddde±XX;
/// "nan", "inf", "-inf" for the non-finite values.
std::string python_float_repr(double value);

}  // namespace deepspeed::monitor::detail

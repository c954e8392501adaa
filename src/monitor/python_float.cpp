// Python float repr: shortest digits from std::to_chars, then Python's layout rules
// (format_float_short in CPython's pystrtod.c: exponent form when decpt <= -4 or decpt > 16).
#include "monitor/python_float.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace deepspeed::monitor::detail {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits in scientific form: "-d.ddde±XX".
  auto res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  const int exponent = std::atoi(sci.c_str() + e + 1);
  // CPython's decpt: the value is 0.DIGITS * 10^decpt.
  const int decpt = exponent + 1;
  if (value == 0.0) return sign + "0.0";
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + buf;
  }
  std::string out;
  if (decpt <= 0) {
    out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out = digits + std::string(decpt - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return sign + out;
}

}  // namespace deepspeed::monitor::detail

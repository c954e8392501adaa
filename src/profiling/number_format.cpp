// Number formatting shared by the profile report.
#include "profiling/number_format.h"

#include <cstdio>
#include <cstdlib>

namespace deepspeed::profiling::detail {

std::string rounded_g(double x) {
  // Python's round(x, 2) rounds the exact binary value; so does printf's %.2f.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  std::snprintf(buf, sizeof buf, "%g", std::strtod(buf, nullptr));
  return buf;
}

std::string number_to_string(double num) {
  double magnitude = 1.0;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1.0, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else if (num >= 1e-6) {
    magnitude = 1e-6, units = "u";
  } else if (num >= 1e-9) {
    magnitude = 1e-9, units = "n";
  } else if (num >= 1e-12) {
    magnitude = 1e-12, units = "p";
  }
  return rounded_g(num / magnitude) + " " + units;
}

std::string macs_to_string(double macs) { return number_to_string(macs) + "MACs"; }
std::string flops_to_string(double flops) { return number_to_string(flops) + "FLOPS"; }
std::string duration_to_string(double seconds) { return number_to_string(seconds) + "s"; }

std::string params_to_string(double params) {
  std::string s = number_to_string(params);
  // DeepSpeed writes billions of parameters as "B", not "G".
  for (char& c : s) {
    if (c == 'G') c = 'B';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace deepspeed::profiling::detail

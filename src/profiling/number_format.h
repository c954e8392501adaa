// DeepSpeed's flops-profiler number formatting (profiling/flops_profiler/profiler.py helpers):
// a value scaled to T/G/M/K/(none)/m/u/n/p, rounded to 2 decimals, printed with Python's "{:g}".
#pragma once

#include <cstdint>
#include <string>

namespace deepspeed::profiling::detail {

/// "1.23 G", "0 ", "512 ", "45.6 m".
std::string number_to_string(double num);
/// "1.23 GMACs"
std::string macs_to_string(double macs);
/// "1.23 GFLOPS"
std::string flops_to_string(double flops);
/// "1.23 M", "1.23 B" (billions), no trailing space.
std::string params_to_string(double params);
/// "45.6 ms", "1.2 s"
std::string duration_to_string(double seconds);
/// Python's "{:g}".format(round(x, 2)): "100", "12.35", "0.5".
std::string rounded_g(double x);

}  // namespace deepspeed::profiling::detail

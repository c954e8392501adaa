// The text of the flops profiler's report, laid out as DeepSpeed's print_model_profile():
// summary, aggregated profile per depth, and the annotated module tree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/profiler.h"
#include "profiling/module_tree.h"

namespace deepspeed::profiling::detail {

/// One module's totals, children included.
struct NodeTotals {
  int64_t macs = 0;
  int64_t flops = 0;
  double latency_s = 0.0;
};

struct ReportOptions {
  int64_t profile_step = 1;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  bool detailed = true;
  double recompute_fwd_factor = 0.0;
};

std::string format_profile(const ModuleTree& tree, const std::vector<NodeTotals>& totals,
                           const ProfileContext& context, const ReportOptions& options);

}  // namespace deepspeed::profiling::detail

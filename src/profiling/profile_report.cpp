// Report formatting. Section rules, labels and number formats follow DeepSpeed's so that the
// output reads (and greps) the same; the notes under the detailed profile are this port's own.
#include "profiling/profile_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "monitor/python_float.h"
#include "profiling/number_format.h"

namespace deepspeed::profiling::detail {
namespace {

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// DeepSpeed's line_fmt '{:<70} {:<8}'.
void line(std::string& out, const std::string& label, const std::string& value) {
  out += pad(label, 70) + " " + pad(value, 8) + "\n";
}

std::string percent(double part, double total) {
  return rounded_g(total != 0.0 ? 100.0 * part / total : 0.0) + "%";
}

std::string round2_repr(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return monitor::detail::python_float_repr(std::strtod(buf, nullptr));
}

// Arguments of a leaf module's pretty_print ("in_features=128, out_features=384, bias=true"),
// which plays the part of PyTorch's extra_repr().
std::string extra_repr(const torch::nn::Module& m) {
  std::ostringstream os;
  m.pretty_print(os);
  const std::string s = os.str();
  const size_t open = s.find('('), close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close <= open ||
      s.find('\n') != std::string::npos) {
    return "";
  }
  return s.substr(open + 1, close - open - 1);
}

void summary(std::string& out, const ModuleTree& tree, const std::vector<NodeTotals>& totals,
             const ProfileContext& c, const ReportOptions& o) {
  const double flops = static_cast<double>(totals[0].flops);
  const double macs = static_cast<double>(totals[0].macs);
  const double params = static_cast<double>(tree.nodes()[0].params);
  const double mp = static_cast<double>(c.mp_world_size);
  out += "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += "Profile Summary at step " + std::to_string(o.profile_step) + ":\n";
  out +=
      "Notations:\n"
      "data parallel size (dp_size), model parallel size(mp_size),\n"
      "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
      "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
      "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  line(out, "world size: ", std::to_string(c.world_size));
  line(out, "data parallel size: ", std::to_string(c.dp_world_size));
  line(out, "model parallel size: ", std::to_string(c.mp_world_size));
  if (c.train_micro_batch_size_per_gpu > 0) {
    line(out, "batch size per GPU: ", std::to_string(c.train_micro_batch_size_per_gpu));
  }
  line(out, "params per GPU: ", params_to_string(params));
  line(out, "params of model = params per GPU * mp_size: ", params_to_string(params * mp));
  line(out, "fwd MACs per GPU: ", macs_to_string(macs));
  line(out, "fwd flops per GPU: ", number_to_string(flops));
  line(out, "fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * mp));
  const double fwd = c.fwd_latency_s.value_or(totals[0].latency_s);
  auto per_s = [](double f, double s) { return s > 0.0 ? f / s : 0.0; };
  line(out, "fwd latency: ", duration_to_string(fwd));
  line(out,
       "fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flops_to_string(per_s(flops, fwd)));
  if (!c.bwd_latency_s || !c.step_latency_s) return;
  const double bwd = *c.bwd_latency_s, step = *c.step_latency_s;
  // Backward costs twice the forward, plus the recomputed share of the forward.
  const double bwd_factor = 2.0 + o.recompute_fwd_factor;
  const std::string bf = rounded_g(bwd_factor), af = rounded_g(bwd_factor + 1.0);
  line(out, "bwd latency: ", duration_to_string(bwd));
  line(out, "bwd FLOPS per GPU = " + bf + " * fwd flops per GPU / bwd latency: ",
       flops_to_string(per_s(bwd_factor * flops, bwd)));
  line(out, "fwd+bwd FLOPS per GPU = " + af + " * fwd flops per GPU / (fwd+bwd latency): ",
       flops_to_string(per_s((bwd_factor + 1.0) * flops, fwd + bwd)));
  line(out, "step latency: ", duration_to_string(step));
  const double iter = fwd + bwd + step;
  line(out, "iter latency: ", duration_to_string(iter));
  line(out, "FLOPS per GPU = " + af + " * fwd flops per GPU / iter latency: ",
       flops_to_string(per_s((bwd_factor + 1.0) * flops, iter)));
  if (c.train_micro_batch_size_per_gpu > 0) {
    const double samples = static_cast<double>(c.train_micro_batch_size_per_gpu * c.world_size);
    line(out, "samples/second: ", round2_repr(per_s(samples, iter)));
  }
}

// Python's repr of a {str: str} dict.
std::string dict_repr(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) s += ", ";
    s += "'" + items[i].first + "': '" + items[i].second + "'";
  }
  return s + "}";
}

void aggregated(std::string& out, const ModuleTree& tree, const std::vector<NodeTotals>& totals,
                const ReportOptions& o) {
  struct TypeTotals {
    double macs = 0, params = 0, latency = 0;
  };
  // Per depth, per module type, in order of first appearance.
  std::vector<std::vector<std::pair<std::string, TypeTotals>>> info;
  for (size_t i = 0; i < tree.nodes().size(); ++i) {
    const auto& n = tree.nodes()[i];
    if (static_cast<int>(info.size()) <= n.depth) info.resize(n.depth + 1);
    auto& level = info[n.depth];
    auto it =
        std::find_if(level.begin(), level.end(), [&](const auto& p) { return p.first == n.type; });
    if (it == level.end()) it = level.insert(level.end(), {n.type, TypeTotals{}});
    it->second.macs += static_cast<double>(totals[i].macs);
    it->second.params += static_cast<double>(n.params);
    it->second.latency += totals[i].latency_s;
  }
  const int64_t max_depth = static_cast<int64_t>(info.size()) - 1;
  const int64_t depth = o.module_depth < 0 ? max_depth : std::min(o.module_depth, max_depth);
  out +=
      "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  out += "Top " + std::to_string(o.top_modules) +
         " modules in terms of params, MACs or fwd latency at different model depths:\n";
  for (int64_t d = 0; d <= depth; ++d) {
    auto top = [&](double TypeTotals::*field, std::string (*fmt)(double)) {
      auto level = info[d];
      std::stable_sort(level.begin(), level.end(), [&](const auto& a, const auto& b) {
        return a.second.*field > b.second.*field;
      });
      std::vector<std::pair<std::string, std::string>> items;
      for (size_t k = 0; k < level.size() && static_cast<int64_t>(k) < o.top_modules; ++k) {
        items.emplace_back(level[k].first, fmt(level[k].second.*field));
      }
      return dict_repr(items);
    };
    out += "depth " + std::to_string(d) + ":\n";
    out += "    params      - " + top(&TypeTotals::params, params_to_string) + "\n";
    out += "    MACs        - " + top(&TypeTotals::macs, macs_to_string) + "\n";
    out += "    fwd latency - " + top(&TypeTotals::latency, duration_to_string) + "\n";
  }
}

// One module as PyTorch's Module.__repr__ lays it out, with the profile as its extra_repr.
std::string module_repr(const ModuleTree& tree, const std::vector<NodeTotals>& totals, int i) {
  const auto& n = tree.nodes()[i];
  const auto& t = totals[i];
  const auto& root = totals[0];
  std::string extra =
      params_to_string(static_cast<double>(n.params)) + " = " +
      percent(static_cast<double>(n.params), static_cast<double>(tree.nodes()[0].params)) +
      " Params, " + macs_to_string(static_cast<double>(t.macs)) + " = " +
      percent(static_cast<double>(t.macs), static_cast<double>(root.macs)) + " MACs, " +
      duration_to_string(t.latency_s) + " = " + percent(t.latency_s, root.latency_s) +
      " latency, " +
      flops_to_string(t.latency_s > 0 ? static_cast<double>(t.flops) / t.latency_s : 0.0);
  const std::string own = extra_repr(*n.module);
  if (!own.empty()) extra += ", " + own;
  if (n.children.empty()) return n.type + "(" + extra + ")";
  std::string s = n.type + "(\n  " + extra;
  for (int child : n.children) {
    const std::string& path = tree.nodes()[child].name;
    const size_t dot = path.rfind('.');
    std::string child_repr = module_repr(tree, totals, child);
    // Indent the child's continuation lines by two, as torch's _addindent.
    std::string indented;
    for (char ch : child_repr) {
      indented += ch;
      if (ch == '\n') indented += "  ";
    }
    s += "\n  (" + (dot == std::string::npos ? path : path.substr(dot + 1)) + "): " + indented;
  }
  return s + "\n)";
}

}  // namespace

std::string format_profile(const ModuleTree& tree, const std::vector<NodeTotals>& totals,
                           const ProfileContext& context, const ReportOptions& options) {
  std::string out;
  summary(out, tree, totals, context, options);
  aggregated(out, tree, totals, options);
  if (options.detailed) {
    out +=
        "\n------------------------------ Detailed Profile per GPU "
        "------------------------------\n";
    out +=
        "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
        "percentage of total fwd latency, fwd FLOPS\n\n"
        "Note: 1. Operators are attributed to modules from the parameters they read and from "
        "their neighbours (C++ modules have no forward hooks); an operator that cannot be placed "
        "more precisely is counted in the deepest module certainly containing it, so a parent's "
        "MACs (or latency) can exceed the sum of its submodules'. A ModuleScope in a module's "
        "forward makes its counts exact.\n"
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed "
        "using that could be larger than the maximum system throughput.\n"
        "3. The top module's latency is the wall time of the profiled forward; the others sum "
        "their operators' times.\n\n";
    out += module_repr(tree, totals, 0) + "\n";
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

}  // namespace deepspeed::profiling::detail

// Stage bounds of a pipeline: DeepSpeed's partition_uniform / partition_balanced and the three
// partition methods of PipelineModule (uniform, parameters, type:<regex>), and the partition as
// DeepSpeed prints it. Pure arithmetic, except that "parameters" builds each layer once to count
// its parameters.
#include <algorithm>
#include <cctype>
#include <iomanip>
#include <limits>
#include <regex>
#include <sstream>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "util/check.h"

namespace deepspeed::pipe {

std::vector<int> partition_uniform(int num_items, int num_parts) {
  std::vector<int> parts(static_cast<size_t>(num_parts) + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts;
  const int residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk + std::min(p, residual);
  return parts;
}

std::vector<int> partition_balanced(const std::vector<double>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size());
  const int m = num_parts;
  if (n <= m) return partition_uniform(n, m);
  // Matches DeepSpeed's dynamic program for the linear partition problem: cost = heaviest minus
  // lightest run; among equal costs the last cut position wins (its `>=`).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto at = [m](int i, int j) { return static_cast<size_t>(i) * (m + 1) + j; };
  std::vector<double> dp_max((n + 1) * (m + 1), kInf), dp_min((n + 1) * (m + 1), kInf),
      dp_cost((n + 1) * (m + 1), kInf);
  std::vector<int> position((n + 1) * (m + 1), 0);
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  dp_max[at(0, 0)] = 0;
  dp_cost[at(0, 0)] = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double run = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[at(k, j - 1)], run);
        const double min_sum = std::min(dp_min[at(k, j - 1)], run);
        const double cost = max_sum - min_sum;
        if (dp_cost[at(i, j)] >= cost) {
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = max_sum;
          dp_min[at(i, j)] = min_sum;
          position[at(i, j)] = k;
        }
      }
    }
  }
  std::vector<int> parts{n};
  for (int j = m; j >= 1; --j) parts.push_back(position[at(parts.back(), j)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<int> partition_layers(const std::vector<LayerSpec>& specs, const std::string& method_in,
                                  int num_stages) {
  const int n = static_cast<int>(specs.size());
  DS_CHECK(num_stages >= 1, ConfigError, "PipelineModule: num_stages is ", num_stages,
           "; expected at least 1");
  DS_CHECK(num_stages <= n, ConfigError, "PipelineModule: ", num_stages, " stages for ", n,
           " layers; every stage needs at least one layer (use at most ", n,
           " stages, or split the model into more layer specs)");
  std::string method = method_in;
  for (auto& ch : method) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (method == "uniform") return partition_uniform(n, num_stages);
  if (method == "parameters") {
    std::vector<double> counts(static_cast<size_t>(n), 0.0);
    for (int i = 0; i < n; ++i) {
      Layer layer = specs[i].build();
      if (!layer.module) continue;
      for (const auto& p : layer.module->parameters()) {
        if (p.requires_grad()) counts[i] += static_cast<double>(p.numel());
      }
    }
    return partition_balanced(counts, num_stages);
  }
  if (method.rfind("type:", 0) == 0) {
    // DeepSpeed matches the type name with re.search, ignoring case.
    const std::string pattern = method_in.substr(5);
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::icase | std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError("PipelineModule: partition_method \"" + method_in +
                        "\": the pattern is not a valid regular expression (" + e.what() + ")");
    }
    std::vector<double> binary(static_cast<size_t>(n), 0.0);
    bool any = false;
    for (int i = 0; i < n; ++i) {
      if (std::regex_search(specs[i].type_name, re)) {
        binary[i] = 1.0;
        any = true;
      }
    }
    DS_CHECK(any, ConfigError, "PipelineModule: partition_method \"", method_in,
             "\" matches no layer type (Partitioning '", pattern,
             "' found no valid layers to partition); the layer types are the specs' type_name");
    return partition_balanced(binary, num_stages);
  }
  throw ConfigError("PipelineModule: partition_method \"" + method_in +
                    "\" is not implemented; expected \"parameters\", \"uniform\" or "
                    "\"type:<regex>\"");
}

std::vector<std::string> describe_partition(const std::vector<LayerSpec>& specs,
                                            const std::vector<int>& parts,
                                            const std::string& method) {
  std::vector<std::string> lines{"Partitioning pipeline stages with method " + method};
  for (size_t s = 0; s + 1 < parts.size(); ++s) {
    lines.push_back("stage=" + std::to_string(s) +
                    " layers=" + std::to_string(parts[s + 1] - parts[s]));
    for (int i = parts[s]; i < parts[s + 1]; ++i) {
      std::ostringstream line;
      line << "    " << std::setw(2) << i << ": " << specs[static_cast<size_t>(i)].type_name;
      lines.push_back(line.str());
    }
  }
  return lines;
}

}  // namespace deepspeed::pipe

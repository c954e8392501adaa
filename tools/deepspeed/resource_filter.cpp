// --include/--exclude/--num_nodes/--num_gpus: see resource_filter.h.
#include "resource_filter.h"

#include <algorithm>

#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

std::string quoted(const std::string& flag, const std::string& text) { return flag + " '" + text + "'"; }

const HostSlots* find_host(const ResourcePool& pool, const std::string& host) {
  for (const HostSlots& h : pool) {
    if (h.host == host) return &h;
  }
  return nullptr;
}

std::string host_names(const ResourcePool& pool) {
  std::vector<std::string> names;
  for (const HostSlots& h : pool) names.push_back(h.host);
  return join(names, ", ");
}

std::vector<int> all_slots(int count) {
  std::vector<int> slots;
  for (int s = 0; s < count; ++s) slots.push_back(s);
  return slots;
}

// Checks every spec against the pool: the host exists and each slot is one of its slots.
void check_specs(const ResourcePool& pool, const std::vector<NodeSpec>& specs, const std::string& flag,
                 const std::string& text) {
  for (const NodeSpec& spec : specs) {
    const HostSlots* host = find_host(pool, spec.host);
    if (host == nullptr) {
      throw UsageError(quoted(flag, text) + ": host '" + spec.host + "' is not in the hostfile (its hosts: " +
                       host_names(pool) + ")");
    }
    for (int slot : spec.slots) {
      if (slot >= host->slots) {
        throw UsageError(quoted(flag, text) + ": host '" + spec.host + "' has no slot " + std::to_string(slot) +
                         "; the hostfile gives it slots 0-" + std::to_string(host->slots - 1) + " (line " +
                         std::to_string(host->line) + ")");
      }
    }
  }
}

WorldInfo include_only(const ResourcePool& pool, const std::vector<NodeSpec>& specs) {
  WorldInfo world;
  for (const HostSlots& host : pool) {
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const NodeSpec& s) { return s.host == host.host; });
    if (spec == specs.end()) continue;
    world.push_back(NodeSlots{host.host, spec->slots.empty() ? all_slots(host.slots) : spec->slots});
  }
  return world;
}

WorldInfo exclude(const ResourcePool& pool, const std::vector<NodeSpec>& specs, const std::string& text) {
  WorldInfo world;
  for (const HostSlots& host : pool) {
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const NodeSpec& s) { return s.host == host.host; });
    std::vector<int> slots = all_slots(host.slots);
    if (spec != specs.end()) {
      if (spec->slots.empty()) continue;
      slots.erase(std::remove_if(slots.begin(), slots.end(),
                                 [&](int s) {
                                   return std::find(spec->slots.begin(), spec->slots.end(), s) != spec->slots.end();
                                 }),
                  slots.end());
    }
    if (!slots.empty()) world.push_back(NodeSlots{host.host, slots});
  }
  if (world.empty()) {
    throw UsageError(quoted("--exclude", text) + " excludes every slot of the hostfile (" + host_names(pool) +
                     "); nothing is left to run on");
  }
  return world;
}

}  // namespace

std::vector<NodeSpec> parse_node_specs(const std::string& text, const std::string& flag) {
  std::vector<NodeSpec> specs;
  for (const std::string& token : split(text, '@')) {
    if (trim(token).empty()) {
      throw UsageError(quoted(flag, text) + ": empty host spec (check for '@@' or a leading/trailing '@'); "
                       "expected HOST[:SLOT,...][@HOST[:SLOT,...]...], e.g. worker-0@worker-1:0,2");
    }
    std::vector<std::string> parts = split(token, ':');
    if (parts.size() > 2) {
      throw UsageError(quoted(flag, text) + ": '" + token + "' has more than one ':'; expected HOST:SLOT,SLOT");
    }
    const std::string& host = parts[0];
    if (host.empty()) throw UsageError(quoted(flag, text) + ": '" + token + "' has no host name before ':'");
    std::vector<int> slots;
    if (parts.size() == 2) {
      for (const std::string& item : split(parts[1], ',')) {
        std::optional<int> slot = parse_decimal(trim(item));
        if (!slot) {
          throw UsageError(quoted(flag, text) + ": slot '" + item + "' in '" + token +
                           "' is not a non-negative integer; expected HOST:SLOT,SLOT, e.g. worker-1:0,2");
        }
        slots.push_back(*slot);
      }
    }
    auto existing = std::find_if(specs.begin(), specs.end(), [&](const NodeSpec& s) { return s.host == host; });
    if (existing == specs.end()) {
      specs.push_back(NodeSpec{host, slots});
    } else if (!existing->slots.empty() && !slots.empty()) {
      existing->slots.insert(existing->slots.end(), slots.begin(), slots.end());
    } else {
      existing->slots.clear();  // the whole host was named once: the whole host it is
    }
  }
  for (NodeSpec& spec : specs) {
    std::sort(spec.slots.begin(), spec.slots.end());
    spec.slots.erase(std::unique(spec.slots.begin(), spec.slots.end()), spec.slots.end());
  }
  return specs;
}

WorldInfo select_resources(const ResourcePool& pool, const ResourceRequest& request) {
  const bool filtered = !request.include.empty() || !request.exclude.empty();
  if (!request.include.empty() && !request.exclude.empty()) {
    throw UsageError("--include and --exclude are mutually exclusive; give one of them");
  }
  if (filtered && (request.num_nodes != -1 || request.num_gpus != -1)) {
    throw UsageError(std::string(request.num_nodes != -1 ? "--num_nodes" : "--num_gpus") +
                     " cannot be combined with " + (request.include.empty() ? "--exclude" : "--include") +
                     " (as in DeepSpeed); name the hosts and slots in the one flag instead");
  }
  if (request.num_nodes == 0 || request.num_nodes < -1) {
    throw UsageError("--num_nodes " + std::to_string(request.num_nodes) + ": expected a positive number of hosts");
  }
  if (request.num_nodes > static_cast<int>(pool.size())) {
    throw UsageError("--num_nodes " + std::to_string(request.num_nodes) + " but the hostfile lists only " +
                     std::to_string(pool.size()) + " host(s): " + host_names(pool));
  }
  if (request.num_gpus == 0 || request.num_gpus < -1) {
    throw UsageError("--num_gpus " + std::to_string(request.num_gpus) + ": expected a positive number of ranks per host");
  }

  WorldInfo world;
  if (!request.include.empty()) {
    std::vector<NodeSpec> specs = parse_node_specs(request.include, "--include");
    check_specs(pool, specs, "--include", request.include);
    world = include_only(pool, specs);
  } else if (!request.exclude.empty()) {
    std::vector<NodeSpec> specs = parse_node_specs(request.exclude, "--exclude");
    check_specs(pool, specs, "--exclude", request.exclude);
    world = exclude(pool, specs, request.exclude);
  } else {
    for (const HostSlots& host : pool) world.push_back(NodeSlots{host.host, all_slots(host.slots)});
  }
  if (request.num_nodes > 0) world.resize(static_cast<std::size_t>(request.num_nodes));
  if (request.num_gpus > 0) {
    for (NodeSlots& node : world) node.slots = all_slots(request.num_gpus);
  }
  return world;
}

}  // namespace deepspeed::launcher

// Resource selection: hostfile pool + --include/--exclude/--num_nodes/--num_gpus -> the WorldInfo
// the job runs on, with DeepSpeed's semantics (runner.py parse_inclusion_exclusion and main) and
// errors that name the offending token. Pure.
//
// Spec syntax: NODE_SPEC[@NODE_SPEC ...], NODE_SPEC = HOST[:SLOT[,SLOT ...]].
//   --include: only the named hosts; HOST alone = all its slots, HOST:0,2 = those slots; repeated
//              specs of one host merge; slots are sorted and deduplicated.
//   --exclude: everything but the named hosts (HOST alone) or slots (HOST:1); hosts left without
//              slots are dropped.
//   --num_nodes N: the first N hosts.  --num_gpus G: every host's slots become 0..G-1.
// The result keeps hostfile order (which defines the ranks).
#pragma once

#include <string>
#include <vector>

#include "hostfile.h"
#include "world_info.h"

namespace deepspeed::launcher {

struct ResourceRequest {
  std::string include;  // -i/--include; "" = not given
  std::string exclude;  // -e/--exclude; "" = not given
  int num_nodes = -1;   // --num_nodes; -1 = all hosts
  int num_gpus = -1;    // --num_gpus/--num_accelerators; -1 = the hostfile's slots
};

// One parsed NODE_SPEC: slots empty = the whole host.
struct NodeSpec {
  std::string host;
  std::vector<int> slots;
};

// Parses a spec list (`flag` names it in errors). Specs of the same host merge, in first-seen
// order; slots are sorted and deduplicated. Throws UsageError naming the flag and the token for an
// empty spec ("a@@b", trailing '@'), a missing host (":0"), more than one ':', an empty slot list
// ("a:" or "a:0,"), or a slot that is not a non-negative integer.
std::vector<NodeSpec> parse_node_specs(const std::string& text, const std::string& flag);

// Applies the request to the pool. Throws UsageError for: --include with --exclude (mutually
// exclusive); --num_nodes/--num_gpus with --include/--exclude (as DeepSpeed); a host that is not in
// the hostfile; a slot the hostfile does not give that host; an --exclude that leaves nothing;
// --num_nodes 0, below -1, or above the number of hosts; --num_gpus 0 or below -1.
WorldInfo select_resources(const ResourcePool& pool, const ResourceRequest& request);

}  // namespace deepspeed::launcher

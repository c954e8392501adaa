// WorldInfo: the active resources of a job, {host: [slot, ...]} in rank order, and its wire form
// --world_info=<url-safe base64 of the JSON object> that DeepSpeed's runner hands each per-node
// launcher (launch.py). Ranks are numbered consecutively over the hosts in order, slot by slot.
#pragma once

#include <string>
#include <vector>

namespace deepspeed::launcher {

struct NodeSlots {
  std::string host;
  std::vector<int> slots;  // device indices on that host (CUDA_VISIBLE_DEVICES); one rank each
};

using WorldInfo = std::vector<NodeSlots>;

// Number of ranks: the sum of the slot counts.
int world_size(const WorldInfo& world);

// Global rank of the first rank of node `node_rank` (the slots of the nodes before it).
int first_rank_of_node(const WorldInfo& world, int node_rank);

// JSON {"host": [0, 1], ...} in order, then url-safe base64 with padding, as DeepSpeed's
// encode_world_info (json.dumps + base64.urlsafe_b64encode).
std::string encode_world_info(const WorldInfo& world);

// Inverse of encode_world_info; also accepts the standard base64 alphabet and missing padding.
// Throws UsageError naming --world_info when the text is not base64, not a JSON object of
// string -> list of non-negative integers, has no hosts, or a host without slots.
WorldInfo decode_world_info(const std::string& encoded);

// "worker-0:0,1@worker-1:0": the --include form, for messages and logs.
std::string describe_world(const WorldInfo& world);

// RFC 4648 §5 (url-safe) base64 with '=' padding; exposed for tests.
std::string base64_url_encode(const std::string& bytes);
// Accepts both alphabets, with or without padding; throws UsageError on any other character.
std::string base64_decode(const std::string& text);

}  // namespace deepspeed::launcher

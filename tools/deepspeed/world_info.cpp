// World info encoding: see world_info.h. nlohmann::ordered_json keeps the hosts in rank order
// (a plain json object would sort them by name and renumber the ranks).
#include "world_info.h"

#include <nlohmann/json.hpp>

#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr const char* kUrlAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-' || c == '+') return 62;
  if (c == '_' || c == '/') return 63;
  return -1;
}

std::string slot_list(const std::vector<int>& slots) {
  std::vector<std::string> parts;
  for (int s : slots) parts.push_back(std::to_string(s));
  return join(parts, ",");
}

}  // namespace

int world_size(const WorldInfo& world) {
  int total = 0;
  for (const NodeSlots& node : world) total += static_cast<int>(node.slots.size());
  return total;
}

int first_rank_of_node(const WorldInfo& world, int node_rank) {
  int first = 0;
  for (int n = 0; n < node_rank && n < static_cast<int>(world.size()); ++n) {
    first += static_cast<int>(world[static_cast<std::size_t>(n)].slots.size());
  }
  return first;
}

std::string base64_url_encode(const std::string& bytes) {
  std::string out;
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kUrlAlphabet[(v >> shift) & 63];
  }
  std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kUrlAlphabet[(v >> 18) & 63];
    out += kUrlAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kUrlAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  std::size_t end = text.size();
  while (end > 0 && text[end - 1] == '=') --end;
  for (std::size_t i = 0; i < end; ++i) {
    int v = sextet(text[i]);
    if (v < 0) {
      throw UsageError("--world_info: character '" + std::string(1, text[i]) + "' at offset " +
                       std::to_string(i) + " is not base64");
    }
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

std::string encode_world_info(const WorldInfo& world) {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (const NodeSlots& node : world) object[node.host] = node.slots;
  return base64_url_encode(object.dump());
}

WorldInfo decode_world_info(const std::string& encoded) {
  std::string json_text = base64_decode(encoded);
  nlohmann::ordered_json object;
  try {
    object = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--world_info: decodes to '" + json_text + "', which is not JSON: " + e.what());
  }
  const std::string expected = "; expected a JSON object {\"host\": [slot, ...], ...} as the launcher writes it";
  if (!object.is_object() || object.empty()) {
    throw UsageError("--world_info: '" + json_text + "' names no hosts" + expected);
  }
  WorldInfo world;
  for (const auto& [host, slots] : object.items()) {
    if (!slots.is_array() || slots.empty()) {
      throw UsageError("--world_info: host '" + host + "' has no slot list" + expected);
    }
    NodeSlots node{host, {}};
    for (const auto& slot : slots) {
      if (!slot.is_number_integer() || slot.get<long long>() < 0) {
        throw UsageError("--world_info: host '" + host + "' has slot " + slot.dump() +
                         ", not a non-negative integer" + expected);
      }
      node.slots.push_back(slot.get<int>());
    }
    world.push_back(std::move(node));
  }
  return world;
}

std::string describe_world(const WorldInfo& world) {
  std::vector<std::string> parts;
  for (const NodeSlots& node : world) parts.push_back(node.host + ":" + slot_list(node.slots));
  return join(parts, "@");
}

}  // namespace deepspeed::launcher

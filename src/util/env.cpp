// The single place that calls getenv (see env.h).
#include "util/env.h"

#include <cstdlib>

#include "util/check.h"

namespace deepspeed::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::optional<int64_t> get_int(const char* name) {
  auto v = get(name);
  if (!v || v->empty()) return std::nullopt;
  try {
    size_t pos = 0;
    int64_t out = std::stoll(*v, &pos);
    if (pos == v->size()) return out;
  } catch (const std::exception&) {
  }
  throw ConfigError(std::string("environment variable ") + name + "='" + *v +
                    "' is not an integer");
}

std::optional<double> get_double(const char* name) {
  auto v = get(name);
  if (!v || v->empty()) return std::nullopt;
  try {
    size_t pos = 0;
    double out = std::stod(*v, &pos);
    if (pos == v->size()) return out;
  } catch (const std::exception&) {
  }
  throw ConfigError(std::string("environment variable ") + name + "='" + *v +
                    "' is not a number");
}

}  // namespace deepspeed::env

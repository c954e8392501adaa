// ScheduleParams: typed reads of scheduler.params with DeepSpeed's defaults and per-group lists.
#include "runtime/optim/schedule_params.h"

#include <algorithm>

#include "config/json_reader.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::optim::detail {

ScheduleParams::ScheduleParams(const json& params, const std::string& source, size_t num_groups)
    : params_(params), base_(source + ": scheduler.params."), num_groups_(num_groups) {
  DS_CHECK(params_.is_object(), ConfigError, source, ": scheduler.params is ", params_.dump(),
           "; expected an object");
}

const json* ScheduleParams::raw(const std::string& key) {
  known_.push_back(key);
  auto it = params_.find(key);
  if (it == params_.end() || it->is_null()) return nullptr;
  // "auto" is Hugging Face's placeholder (warm-up steps and lrs from its TrainingArguments);
  // no number can be derived here, so it is refused rather than read as the default.
  DS_CHECK(!config_detail::is_auto(*it), ConfigError, where(key), " ",
           config_detail::auto_placeholder_message("a number"));
  return &*it;
}

double ScheduleParams::number(const std::string& key, double fallback) {
  return opt_number(key).value_or(fallback);
}

std::optional<double> ScheduleParams::opt_number(const std::string& key) {
  const json* v = raw(key);
  if (v == nullptr) return std::nullopt;
  DS_CHECK(v->is_number(), ConfigError, where(key), " is ", v->dump(), "; expected a number");
  return v->get<double>();
}

int64_t ScheduleParams::positive_int(const std::string& key, int64_t fallback) {
  const json* v = raw(key);
  if (v == nullptr) return fallback;
  DS_CHECK(v->is_number_integer() && v->get<int64_t>() > 0, ConfigError, where(key), " is ",
           v->dump(), "; expected a positive integer");
  return v->get<int64_t>();
}

bool ScheduleParams::boolean(const std::string& key, bool fallback) {
  const json* v = raw(key);
  if (v == nullptr) return fallback;
  DS_CHECK(v->is_boolean(), ConfigError, where(key), " is ", v->dump(),
           "; expected true or false");
  return v->get<bool>();
}

bool ScheduleParams::warmup_is_log(const std::string& key) {
  const json* v = raw(key);
  if (v == nullptr) return true;
  if (v->is_string() && v->get<std::string>() == "linear") return false;
  if (v->is_string() && v->get<std::string>() == "log") return true;
  warn(where(key) + " is " + v->dump() + "; expected \"log\" or \"linear\", using \"log\"");
  return true;
}

std::optional<PerGroup> ScheduleParams::opt_per_group(const std::string& key) {
  const json* v = raw(key);
  if (v == nullptr) return std::nullopt;
  PerGroup out;
  if (v->is_array()) {
    DS_CHECK(!v->empty(), ConfigError, where(key),
             " is []; expected a number or one per param group");
    DS_CHECK(num_groups_ == 0 || v->size() == num_groups_, ConfigError, where(key), ": expected ",
             num_groups_, " values for ", key, ", got ", v->size(), " (one per param group)");
    for (size_t i = 0; i < v->size(); ++i) {
      DS_CHECK((*v)[i].is_number(), ConfigError, where(key), "[", i, "] is ", (*v)[i].dump(),
               "; expected a number");
      out.values.push_back((*v)[i].get<double>());
    }
    return out;
  }
  DS_CHECK(v->is_number(), ConfigError, where(key), " is ", v->dump(),
           "; expected a number or a list with one number per param group");
  out.values.push_back(v->get<double>());
  return out;
}

PerGroup ScheduleParams::per_group(const std::string& key, double fallback) {
  return opt_per_group(key).value_or(PerGroup{{fallback}});
}

void ScheduleParams::finish(const std::string& type) {
  for (auto it = params_.begin(); it != params_.end(); ++it) {
    DS_CHECK(std::find(known_.begin(), known_.end(), it.key()) != known_.end(), ConfigError,
             where(it.key()), " is not a parameter of ", type);
  }
}

void ScheduleParams::warn(const std::string& message) const {
  if (num_groups_ > 0) log::warn_rank0(message);
}

}  // namespace deepspeed::optim::detail

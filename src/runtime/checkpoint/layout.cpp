// DeepSpeed's checkpoint names and the `latest` file (reference §6.1, §5.4-5.5).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "deepspeed/checkpoint.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::checkpoint {
namespace {

std::string two_digits(int rank) {
  std::string s = std::to_string(rank);
  return s.size() < 2 ? "0" + s : s;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// DeepSpeed's natural_keys: digit runs compare as numbers, the rest as text.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
      while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
      // Compare by value without overflow: strip leading zeros, then length, then digits.
      auto strip = [](const std::string& s, size_t from, size_t to) {
        while (from + 1 < to && s[from] == '0') ++from;
        return s.substr(from, to - from);
      };
      const std::string x = strip(a, i, i_end), y = strip(b, j, j_end);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::string default_tag(int64_t global_steps) { return "global_step" + std::to_string(global_steps); }

std::string tag_directory(const std::string& save_dir, const std::string& tag) {
  DS_CHECK(!save_dir.empty(), CheckpointError, "checkpoint directory is empty");
  DS_CHECK(!tag.empty(), CheckpointError, "checkpoint tag is empty");
  return save_dir.back() == '/' ? save_dir + tag : save_dir + "/" + tag;
}

std::string model_states_file_name(int mp_rank) {
  return "mp_rank_" + two_digits(mp_rank) + "_model_states.pt";
}

std::string zero3_model_states_file_name(int dp_rank, int mp_rank) {
  return "zero_pp_rank_" + std::to_string(dp_rank) + "_" + model_states_file_name(mp_rank);
}

std::string zero_optim_states_file_name(int dp_rank, int mp_rank, bool bf16) {
  return std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(dp_rank) +
         "_mp_rank_" + two_digits(mp_rank) + "_optim_states.pt";
}

namespace {

std::optional<std::string> find_zero_optim_states_file(const std::string& tag_dir, int dp_rank,
                                                       int mp_rank, bool bf16,
                                                       std::vector<std::string>* tried) {
  for (bool prefix : {bf16, !bf16}) {
    const std::string name = zero_optim_states_file_name(dp_rank, mp_rank, prefix);
    // DeepSpeed's loader also accepts the legacy name without '_' before "optim_states.pt".
    std::string legacy = name;
    legacy.replace(legacy.size() - std::string("_optim_states.pt").size(), 1, "");
    for (const std::string& candidate : {name, legacy}) {
      const std::string path = tag_dir + "/" + candidate;
      if (!is_file(path)) {
        tried->push_back(candidate);
        continue;
      }
      if (prefix != bf16) {
        log::warn(::deepspeed::detail::str_cat(
            "loading ", prefix ? "bf16" : "fp16", " ZeRO checkpoint ", path, " into a ",
            bf16 ? "bf16" : "fp16", " training engine"));
      }
      return path;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_zero_optim_states_file_if_any(const std::string& tag_dir,
                                                              int dp_rank, int mp_rank, bool bf16) {
  std::vector<std::string> tried;
  return find_zero_optim_states_file(tag_dir, dp_rank, mp_rank, bf16, &tried);
}

std::string find_zero_optim_states_file(const std::string& tag_dir, int dp_rank, int mp_rank,
                                        bool bf16) {
  std::vector<std::string> tried;
  if (auto path = find_zero_optim_states_file(tag_dir, dp_rank, mp_rank, bf16, &tried)) {
    return *path;
  }
  std::ostringstream names;
  for (size_t i = 0; i < tried.size(); ++i) names << (i ? ", " : "") << tried[i];
  DS_CHECK(false, CheckpointError, tag_dir, ": no ZeRO optimizer file for data-parallel rank ",
           dp_rank, " (tried ", names.str(), "); was the checkpoint written by fewer ranks, or "
           "did one rank fail to save?");
  return {};
}

std::vector<std::string> list_files_with_suffix(const std::string& dir, const std::string& suffix) {
  DIR* d = ::opendir(dir.c_str());
  DS_CHECK(d != nullptr, CheckpointError, "checkpoint directory ", dir, " cannot be read: ",
           std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || name.size() < suffix.size()) continue;
    if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end(), natural_less);
  for (auto& name : names) name = dir + "/" + name;
  return names;
}

std::optional<std::string> read_latest(const std::string& save_dir) {
  const std::string path = save_dir + "/" + kLatestFileName;
  if (!is_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string tag = ss.str();
  const auto first = tag.find_first_not_of(" \t\r\n");
  DS_CHECK(first != std::string::npos, CheckpointError, path,
           " is empty: it should name the latest checkpoint tag");
  tag = tag.substr(first, tag.find_last_not_of(" \t\r\n") - first + 1);
  return tag;
}

void write_latest(const std::string& save_dir, const std::string& tag) {
  DS_CHECK(!tag.empty(), CheckpointError, "checkpoint tag is empty");
  write_file_atomically(save_dir + "/" + kLatestFileName, tag);
}

void commit_checkpoint(const std::string& save_dir, const std::string& tag, bool is_global_rank0,
                       bool save_latest, const std::function<void()>& barrier) {
  // Each rank made its own files durable (save() fsyncs file and directory); this makes the
  // tag directory's own entry in save_dir durable before `latest` can point at it.
  fsync_directory(save_dir);
  barrier();
  if (is_global_rank0 && save_latest) write_latest(save_dir, tag);
  barrier();
}

}  // namespace deepspeed::checkpoint

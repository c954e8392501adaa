// The legacy `curriculum_learning` section. DeepSpeed reads it only when enabled (its
// CurriculumScheduler asserts the keys each schedule needs); so does this build, and it reports a
// missing or mistyped key by name at config load rather than at the first training forward.
#include "config/feature_sections.h"

namespace deepspeed::config_detail {
namespace {

constexpr const char* kScheduleTypes[] = {"fixed_linear", "fixed_root", "fixed_discrete",
                                          "custom"};

void require(ConfigReader& r, const char* key, const std::string& why) {
  if (!r.has(key)) r.fail(key, "is required " + why);
}

void parse_schedule_config(ConfigReader& section, CurriculumLearningConfig& cl,
                           std::vector<std::string>& warnings) {
  ConfigReader s = section.section("schedule_config", Strictness::kWarnUnknown);
  const std::string why = "with schedule_type \"" + cl.schedule_type + "\"";
  if (cl.schedule_type == "fixed_discrete") {
    require(s, "difficulty", why);
    require(s, "max_step", why);
    cl.difficulty = s.get_int_list("difficulty");
    cl.max_step = s.get_int_list("max_step");
    if (cl.max_step.empty()) s.fail("max_step", "is empty; expected at least one step");
    if (cl.difficulty.size() != cl.max_step.size() + 1) {
      s.fail("difficulty", "has " + std::to_string(cl.difficulty.size()) +
                               " entries; expected one more than max_step's " +
                               std::to_string(cl.max_step.size()) +
                               " (the last difficulty holds for every later step)");
    }
  } else if (cl.schedule_type == "fixed_linear" || cl.schedule_type == "fixed_root") {
    require(s, "total_curriculum_step", why);
    require(s, "difficulty_step", why);
    cl.total_curriculum_step = s.get_int("total_curriculum_step", 0, 1);
    cl.difficulty_step = s.get_int("difficulty_step", 1, 1);
    if (cl.schedule_type == "fixed_root") {
      require(s, "root_degree", why);
      cl.root_degree = s.get_double("root_degree", 1);
      if (cl.root_degree <= 0) s.fail("root_degree", "must be positive");
    }
    if (cl.difficulty_step % 8 != 0) {
      // DeepSpeed's warning, worded for this build.
      warnings.push_back(s.where("difficulty_step") + " is " +
                         std::to_string(cl.difficulty_step) +
                         "; with the seqlen metric it should be a multiple of 8 (fp16 data) or "
                         "16 (int8 data) for NVIDIA Tensor Cores. Disregard this warning if it "
                         "does not apply to your metric or hardware.");
    }
  }
  s.finish();
}

}  // namespace

void parse_curriculum_schedule(ConfigReader& r, CurriculumLearningConfig& cl,
                               std::vector<std::string>& warnings, const std::string& why) {
  for (const char* key : {"min_difficulty", "max_difficulty", "schedule_type"}) {
    require(r, key, why);
  }
  cl.min_difficulty = r.get_int("min_difficulty", 0);
  cl.max_difficulty = r.get_int("max_difficulty", 0);
  cl.schedule_type = r.get_string("schedule_type", "");
  bool known = false;
  for (const char* t : kScheduleTypes) known = known || cl.schedule_type == t;
  if (!known) {
    r.fail("schedule_type", "is \"" + cl.schedule_type +
                                "\"; expected fixed_linear, fixed_root, fixed_discrete or custom");
  }
  if (cl.schedule_type != "custom") require(r, "schedule_config", why);
  parse_schedule_config(r, cl, warnings);
}

void parse_curriculum_learning(ConfigReader& top, DeepSpeedConfig& c) {
  ConfigReader r = top.section("curriculum_learning", Strictness::kWarnUnknown);
  auto& cl = c.curriculum_learning;
  cl.enabled = r.get_bool("enabled", false);
  if (!cl.enabled) {
    // Matches DeepSpeed: a disabled section's other keys are never read.
    for (const auto& key : {"curriculum_type", "min_difficulty", "max_difficulty",
                            "schedule_type", "schedule_config"}) {
      r.mark_known(key);
    }
    r.finish();
    return;
  }
  const std::string why = "when curriculum_learning is enabled";
  require(r, "curriculum_type", why);
  cl.curriculum_type = r.get_string("curriculum_type", "");
  parse_curriculum_schedule(r, cl, c.warnings, why);
  r.finish();
}

void resolve_curriculum_learning(const DeepSpeedConfig& c, json& j) {
  const auto& cl = c.curriculum_learning;
  if (!cl.enabled) {
    j["curriculum_learning"] = {{"enabled", false}};
    return;
  }
  json schedule = json::object();
  if (cl.schedule_type == "fixed_discrete") {
    schedule = {{"difficulty", cl.difficulty}, {"max_step", cl.max_step}};
  } else if (cl.schedule_type != "custom") {
    schedule = {{"total_curriculum_step", cl.total_curriculum_step},
                {"difficulty_step", cl.difficulty_step}};
    if (cl.schedule_type == "fixed_root") schedule["root_degree"] = cl.root_degree;
  }
  j["curriculum_learning"] = {{"enabled", true},
                              {"curriculum_type", cl.curriculum_type},
                              {"min_difficulty", cl.min_difficulty},
                              {"max_difficulty", cl.max_difficulty},
                              {"schedule_type", cl.schedule_type},
                              {"schedule_config", schedule}};
}

}  // namespace deepspeed::config_detail

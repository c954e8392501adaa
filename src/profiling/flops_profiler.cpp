// FlopsProfiler: recording lifecycle (DeepSpeed's start/stop/reset/end_profile), the per-module
// and per-operator totals, and the report; ModuleScope; get_model_profile().
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "deepspeed/profiler.h"
#include "profiling/attribution.h"
#include "profiling/module_tree.h"
#include "profiling/op_recorder.h"
#include "profiling/profile_report.h"
#include "util/check.h"

namespace deepspeed::profiling {
namespace {

std::vector<detail::NodeTotals> node_totals(const detail::ModuleTree& tree,
                                            const detail::OpRecorder& recorder) {
  std::vector<detail::NodeTotals> totals(tree.nodes().size());
  const auto& events = recorder.events();
  const std::vector<int> module_of = detail::attribute_events(tree, events);
  for (size_t i = 0; i < events.size(); ++i) {
    auto& t = totals[module_of[i]];
    t.macs += events[i].cost.macs;
    t.flops += events[i].cost.flops;
    t.latency_s += events[i].duration_s;
  }
  // Pre-order: every child comes after its parent, so one backward pass rolls totals up.
  for (size_t i = tree.nodes().size(); i-- > 1;) {
    auto& parent = totals[tree.nodes()[i].parent];
    parent.macs += totals[i].macs;
    parent.flops += totals[i].flops;
    parent.latency_s += totals[i].latency_s;
  }
  // DeepSpeed's top-level latency is the model's forward as a whole, gaps between operators
  // included.
  totals[0].latency_s = recorder.wall_s();
  return totals;
}

}  // namespace

FlopsProfiler::FlopsProfiler(std::shared_ptr<torch::nn::Module> model, FlopsProfilerConfig config)
    : model_(std::move(model)), config_(std::move(config)) {
  DS_CHECK(model_ != nullptr, UsageError, "FlopsProfiler needs a model");
}

FlopsProfiler::~FlopsProfiler() = default;

void FlopsProfiler::start_profile() {
  DS_CHECK(!started(), UsageError, "flops profiler: start_profile() while already started");
  // A fresh tree each time: the model's parameters may have been replaced since.
  recorder_.reset();
  tree_ = std::make_unique<detail::ModuleTree>(model_);
  recorder_ = std::make_unique<detail::OpRecorder>(*tree_);
  recorder_->start();
}

void FlopsProfiler::stop_profile() {
  if (recorder_) recorder_->stop();
}

void FlopsProfiler::reset_profile() {
  if (recorder_) recorder_->clear();
}

void FlopsProfiler::end_profile() {
  stop_profile();
  recorder_.reset();
  tree_.reset();
}

bool FlopsProfiler::started() const { return recorder_ && recorder_->active(); }

std::vector<ModuleProfile> FlopsProfiler::module_profiles() const {
  std::vector<ModuleProfile> out;
  if (!tree_) return out;
  const auto totals = node_totals(*tree_, *recorder_);
  for (size_t i = 0; i < tree_->nodes().size(); ++i) {
    const auto& n = tree_->nodes()[i];
    out.push_back(ModuleProfile{n.name, n.type, n.depth, n.params, totals[i].macs, totals[i].flops,
                                totals[i].latency_s});
  }
  return out;
}

ModuleProfile FlopsProfiler::module_profile(const std::string& name) const {
  for (auto& p : module_profiles()) {
    if (p.name == name) return p;
  }
  throw UsageError("flops profiler: no module named '" + name + "' in the profiled model" +
                   (tree_ ? "" : " (no profile was started)"));
}

std::map<std::string, OpProfile> FlopsProfiler::op_profiles() const {
  std::map<std::string, OpProfile> out;
  if (!recorder_) return out;
  for (const auto& e : recorder_->events()) {
    auto& p = out[e.op];
    p.calls += 1;
    p.macs += e.cost.macs;
    p.flops += e.cost.flops;
    p.latency_s += e.duration_s;
  }
  return out;
}

int64_t FlopsProfiler::get_total_flops() const {
  int64_t total = 0;
  if (recorder_) {
    for (const auto& e : recorder_->events()) total += e.cost.flops;
  }
  return total;
}

int64_t FlopsProfiler::get_total_macs() const {
  int64_t total = 0;
  if (recorder_) {
    for (const auto& e : recorder_->events()) total += e.cost.macs;
  }
  return total;
}

int64_t FlopsProfiler::get_total_params() const {
  return tree_ ? tree_->nodes()[0].params : detail::ModuleTree(model_).nodes()[0].params;
}

double FlopsProfiler::get_total_duration() const { return recorder_ ? recorder_->wall_s() : 0.0; }

std::string FlopsProfiler::model_profile_string(int64_t profile_step, const ProfileContext& context,
                                                int64_t module_depth, int64_t top_modules,
                                                bool detailed) const {
  DS_CHECK(tree_ != nullptr, UsageError,
           "flops profiler: print_model_profile() before start_profile(); nothing was recorded");
  detail::ReportOptions o;
  o.profile_step = profile_step;
  o.module_depth = module_depth;
  o.top_modules = top_modules;
  o.detailed = detailed;
  o.recompute_fwd_factor = config_.recompute_fwd_factor;
  return detail::format_profile(*tree_, node_totals(*tree_, *recorder_), context, o);
}

void FlopsProfiler::print_model_profile(int64_t profile_step, const ProfileContext& context) const {
  const std::string text = model_profile_string(profile_step, context, config_.module_depth,
                                                config_.top_modules, config_.detailed);
  if (config_.output_file.empty()) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  std::ofstream out(config_.output_file, std::ios::trunc);
  out << text;
  out.flush();
  DS_CHECK(out.good(), Error, "flops_profiler.output_file: cannot write ", config_.output_file,
           ": ", std::strerror(errno));
}

ModuleScope::ModuleScope(const torch::nn::Module& module)
    : pushed_(detail::OpRecorder::push_scope(module)) {}

ModuleScope::~ModuleScope() {
  if (pushed_) detail::OpRecorder::pop_scope();
}

ModelProfile get_model_profile(const std::shared_ptr<torch::nn::Module>& model,
                               const std::function<void()>& forward,
                               const ModelProfileOptions& options) {
  FlopsProfilerConfig config;
  config.module_depth = options.module_depth;
  config.top_modules = options.top_modules;
  config.detailed = options.detailed;
  config.output_file = options.output_file;
  FlopsProfiler prof(model, config);
  model->eval();
  for (int64_t i = 0; i < options.warm_up; ++i) forward();
  prof.start_profile();
  try {
    forward();
  } catch (...) {
    prof.end_profile();
    throw;
  }
  prof.stop_profile();
  ModelProfile result{
      prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params(),
      prof.model_profile_string(options.warm_up, ProfileContext{}, options.module_depth,
                                options.top_modules, options.detailed)};
  if (options.print_profile) prof.print_model_profile(options.warm_up, ProfileContext{});
  prof.end_profile();
  return result;
}

}  // namespace deepspeed::profiling

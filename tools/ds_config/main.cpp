// ds_config: validates a ds_config.json before a big job is launched.
//   ds_config CONFIG.json --world-size N            prints the resolved configuration as JSON
//   ds_config CONFIG.json --world-size N --lr-schedule STEPS   prints step,lr CSV
//   --hidden-size H   fills zero_optimization sizes given as "auto" the way initialize() does
//                     from the model (reduce_bucket_size = H^2, ...; docs/config.md "auto")
// Exit 0 when valid; non-zero with the error on stderr when not. Warnings and notes (how each
// "auto" was resolved) go to stderr.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/optim/optimizer.h>

#include "config/auto_sizes.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/lr_schedules.h"
#include "runtime/optim/optimizer_factory.h"
#include "util/cli_checks.h"

namespace {

// The lr each optimizer update n = 0..steps-1 trains with (DeepSpeed steps the schedule after
// the optimizer, so update n uses the schedule's value for k = n - 1).
void print_lr_schedule(const deepspeed::DeepSpeedConfig& cfg, int64_t steps) {
  double base_lr = 1e-3;  // DeepSpeed's Adam default when no optimizer section is given
  if (cfg.optimizer.present) {
    base_lr = deepspeed::optim::configured_lr(cfg.optimizer, cfg.source);
  }
  std::vector<double> lrs{base_lr};
  std::unique_ptr<deepspeed::optim::LRScheduler> sched;
  double current = base_lr;
  if (cfg.scheduler.present) {
    sched = std::make_unique<deepspeed::optim::LRScheduler>(
        deepspeed::optim::make_lr_schedule(cfg.scheduler, 1, cfg.source), lrs,
        [&current](size_t, double lr) { current = lr; });
  }
  std::printf("step,lr\n");
  for (int64_t n = 0; n < steps; ++n) {
    std::printf("%lld,%.10g\n", static_cast<long long>(n), current);
    if (sched) sched->step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Validate a DeepSpeed config and print the resolved configuration"};
  std::string path;
  int64_t world_size = 1;
  int64_t lr_steps = -1;
  int64_t hidden_size = 0;
  app.add_option("config", path, "ds_config.json path (or inline JSON)")->required();
  app.add_option("--world-size,-w", world_size, "data-parallel world size")
      ->check(deepspeed::util::at_least_one());
  app.add_option("--lr-schedule", lr_steps, "print step,lr CSV for this many optimizer steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--hidden-size", hidden_size,
                 "the model's hidden size, to resolve \"auto\" ZeRO bucket sizes as initialize() "
                 "does")
      ->check(deepspeed::util::at_least_one());
  CLI11_PARSE(app, argc, argv);
  try {
    auto cfg = deepspeed::DeepSpeedConfig::from_string(path, world_size);
    for (const auto& w : cfg.warnings) std::cerr << "warning: " << w << "\n";
    cfg.check_supported();
    const auto& auto_sizes = cfg.zero_optimization.auto_sizes;
    if (hidden_size > 0) {
      deepspeed::config_detail::resolve_auto_sizes(cfg, hidden_size, "--hidden-size");
    } else {
      for (const auto& key : auto_sizes) {
        cfg.notes.push_back(cfg.source + ": zero_optimization." + key +
                            ": \"auto\" is set at initialize from the model's hidden size (" +
                            deepspeed::config_detail::unresolved_auto_size(key) +
                            "); pass --hidden-size to see the value");
      }
    }
    for (const auto& n : cfg.notes) std::cerr << "note: " << n << "\n";
    if (lr_steps >= 0) {
      print_lr_schedule(cfg, lr_steps);
    } else {
      std::cout << cfg.resolved().dump(2) << "\n";
    }
  } catch (const deepspeed::Error& e) {
    std::cerr << "ds_config: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    // Not a deepspeed::Error: a bug in the config reader, reported rather than aborting.
    std::cerr << "ds_config: internal error (a bug in deepspeed-cpp; please report it with the "
                 "config): " << e.what() << "\n";
    return 2;
  } catch (...) {
    std::cerr << "ds_config: internal error: unknown exception (a bug in deepspeed-cpp)\n";
    return 2;
  }
  return 0;
}

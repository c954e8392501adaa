// DeepSpeedConfig::check_supported(): the features (supported_features.cpp, free of LibTorch so
// that the config fuzzer covers it) and the optimizer and scheduler sections, checked by their
// factories, which know each one's parameters.
#include "config/feature_sections.h"
#include "deepspeed/config.h"
#include "deepspeed/lr_schedules.h"
#include "runtime/optim/onebit/onebit_config.h"
#include "runtime/optim/optimizer_factory.h"

namespace deepspeed {

void DeepSpeedConfig::check_supported() const {
  config_detail::check_features_supported(*this);
  if (optimizer.present) optim::check_optimizer_supported(optimizer, source);
  onebit::check_onebit_compatible(*this);
  if (scheduler.present) optim::check_scheduler_supported(scheduler, source);
}

}  // namespace deepspeed

#include "deepspeed/progressive_layer_drop.h"

#include <cmath>

namespace deepspeed {

void ProgressiveLayerDrop::update_state(int64_t global_step) {
  current_theta_ =
      (1.0 - theta_) * std::exp(-gamma_ * static_cast<double>(global_step)) + theta_;
}

}  // namespace deepspeed

// Mpu's defaults that need the communicator.
#include "deepspeed/mpu.h"

namespace deepspeed {

comm::Group Mpu::get_pipe_parallel_group() const {
  // Megatron's mpu has no pipeline group when there is no pipeline: one stage, this rank alone.
  return comm::self_group("pipe");
}

}  // namespace deepspeed

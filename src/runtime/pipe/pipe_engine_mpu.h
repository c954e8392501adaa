// The mpu a PipelineModule gives its engine: gradients average over the stage's data-parallel
// replicas; the "model-parallel" group is the whole pipeline of this replica, so that the
// overflow vote and the gradient norm span every stage (DeepSpeed's slice group); the
// tensor-parallel group is the topology's model axis (a group of one without tensor parallelism).
#pragma once

#include "deepspeed/mpu.h"
#include "deepspeed/parallel_groups.h"

namespace deepspeed::pipe {

class PipeEngineMpu : public Mpu {
 public:
  explicit PipeEngineMpu(const comm::ParallelGroups& g)
      : data_(g.data()), pipe_(g.pipe()), tensor_(g.model()) {}
  comm::Group get_model_parallel_group() const override { return pipe_; }
  comm::Group get_data_parallel_group() const override { return data_; }
  comm::Group get_pipe_parallel_group() const override { return pipe_; }
  const comm::Group& tensor_group() const { return tensor_; }

 private:
  comm::Group data_, pipe_, tensor_;
};

}  // namespace deepspeed::pipe

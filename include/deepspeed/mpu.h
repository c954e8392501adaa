// deepspeed::Mpu: DeepSpeed's `mpu` argument, the object Megatron passes to initialize() to say
// how the ranks divide into model-, data- and pipeline-parallel groups. The engine takes its
// data-parallel group (gradient reduction, ZeRO partitions, checkpoint partition count and
// zero_pp_rank_<dp rank>) and its model-parallel group (the gradient norm, the overflow vote,
// mp_rank_<mp rank> in checkpoint names) from it. Without an mpu the job is data-parallel over
// the world. See docs/comm.md.
#pragma once

#include <memory>

#include "deepspeed/comm.h"
#include "deepspeed/parallel_groups.h"
#include "deepspeed/topology.h"

namespace deepspeed {

/// Megatron's mpu interface, with DeepSpeed's names. The rank / world-size functions default to
/// the group's; the pipeline ones default to no pipeline parallelism (a group of this rank).
class Mpu {
 public:
  virtual ~Mpu() = default;

  virtual comm::Group get_model_parallel_group() const = 0;
  virtual comm::Group get_data_parallel_group() const = 0;
  virtual comm::Group get_pipe_parallel_group() const;

  virtual int get_model_parallel_rank() const { return get_model_parallel_group().rank(); }
  virtual int get_model_parallel_world_size() const { return get_model_parallel_group().size(); }
  virtual int get_data_parallel_rank() const { return get_data_parallel_group().rank(); }
  virtual int get_data_parallel_world_size() const { return get_data_parallel_group().size(); }
  virtual int get_pipe_parallel_rank() const { return get_pipe_parallel_group().rank(); }
  virtual int get_pipe_parallel_world_size() const { return get_pipe_parallel_group().size(); }
};

/// The mpu of a ProcessTopology (axes pipe / data / model, as PipeModelDataParallelTopology):
/// builds its ParallelGroups, so it is collective over the world like them.
class TopologyMpu : public Mpu {
 public:
  explicit TopologyMpu(ProcessTopology topology) : groups_(std::move(topology)) {}

  comm::Group get_model_parallel_group() const override { return groups_.model(); }
  comm::Group get_data_parallel_group() const override { return groups_.data(); }
  comm::Group get_pipe_parallel_group() const override { return groups_.pipe(); }

  const comm::ParallelGroups& groups() const { return groups_; }
  const ProcessTopology& topology() const { return groups_.topology(); }

 private:
  comm::ParallelGroups groups_;
};

}  // namespace deepspeed

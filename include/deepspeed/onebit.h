// Communication compression for DeepSpeed's 1-bit optimizers (OneBitAdam, ZeroOneAdam,
// OneBitLamb): error-compensated 1-bit compression (sign + scale) and the compressed all-reduce
// built from it, as DeepSpeed's compressed backends do it (an all-to-all of packed sign bits and
// an all-gather of scales to the "servers", each of which owns one chunk, then an all-gather of
// the servers' re-compressed chunks). See docs/onebit.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/comm.h"
#include "deepspeed/optimizers.h"

namespace deepspeed::onebit {

/// How a tensor of `numel` elements is cut for a group of `world_size` ranks. DeepSpeed pads to
/// a multiple of world_size * lcm(world_size, 8), so that each server chunk packs into whole
/// bytes: padded_numel = chunk_numel * world_size, chunk_numel % 8 == 0.
struct CompressionLayout {
  int64_t numel = 0;         // the tensor's elements
  int64_t padded_numel = 0;  // worker_error's size
  int64_t chunk_numel = 0;   // one server's chunk: server_error's size
  int world_size = 1;
  /// Elements of chunk `server` that are real (not padding): 0..chunk_numel.
  int64_t valid_in_chunk(int server) const;
};
CompressionLayout compression_layout(int64_t numel, int world_size);

/// Packs the signs of `x` (numel a multiple of 8) into numel/8 bytes, first element in the most
/// significant bit (numpy's packbits order); a bit is 1 when the element is >= 0 (1-bit
/// compression has no zero: 0 counts as +1, as in DeepSpeed).
at::Tensor pack_signs(const at::Tensor& x);
/// The inverse: `bits` (uint8) to numel = 8 * bits.numel() values of +1.0 / -1.0 (float).
at::Tensor unpack_signs(const at::Tensor& bits);

/// Error-compensated 1-bit compression of `x` in place, with `error` (same size, updated):
/// x += error; scale = ||x[:valid]|| / sqrt(valid); error = x - scale * sign(x) on the first
/// `valid` elements and 0 on the rest (padding never feeds back); x = sign bits. Returns the
/// scale (a float scalar tensor) and the packed signs (x.numel()/8 bytes).
struct Compressed {
  at::Tensor scale;
  at::Tensor bits;
};
Compressed compress_with_error(const at::Tensor& x, at::Tensor& error, int64_t valid);

/// DeepSpeed's compressed_allreduce: averages `buffer` (float32, any shape) over `group` in
/// place with 1-bit compression on the worker side (error `worker_error`, layout.padded_numel
/// elements) and on the server side (error `server_error`, layout.chunk_numel elements). Four
/// collectives: all_to_all_single of the workers' packed signs, all_gather of their scales,
/// all_gather of the servers' packed signs, all_gather of their scales. A group of one rank
/// returns `buffer` unchanged. Every member must call it with the same numel. Throws
/// UsageError when the error buffers have the wrong size, CommError when a collective fails.
void compressed_allreduce(at::Tensor& buffer, at::Tensor& worker_error, at::Tensor& server_error,
                          const comm::Group& group);

// --- the optimizers --------------------------------------------------------------------------

/// The optimizer-wide settings of ds_config's 1-bit optimizers, with DeepSpeed's defaults.
struct OneBitSettings {
  /// OneBitAdam, OneBitLamb: steps of full-precision warm-up before compression starts.
  int64_t freeze_step = 100000;
  /// DeepSpeed's MPI backend option; accepted, no effect (comm is Gloo over CPU tensors).
  bool cuda_aware = false;
  /// "nccl" (DeepSpeed's default), "mpi", "hccl" or "compressed": DeepSpeed's backend for the
  /// compressed all-reduce; every name runs the same deepspeed::comm collectives here.
  std::string comm_backend_name = "nccl";
  /// ZeroOneAdam: the last step that may update the variance (T_v's max in the 0/1 Adam paper).
  int64_t var_freeze_step = 100000;
  /// ZeroOneAdam: the variance-update interval doubles after this many updates (kappa).
  int64_t var_update_scaler = 16;
  /// ZeroOneAdam: the local-step interval doubles after this many steps past var_freeze_step.
  int64_t local_step_scaler = 32678;
  /// ZeroOneAdam: the largest local-step interval (H in the paper).
  int64_t local_step_clipper = 16;
  /// OneBitLamb: the momentum of the scaling coefficients' running average during warm-up.
  double coeff_beta = 0.9;
  /// OneBitLamb: bounds of the per-step change of the frozen coefficient's scaling factor.
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;
};

/// What the engine asks of an optimizer that communicates by itself (DeepSpeed's
/// engine.enable_backward_allreduce, which its 1-bit optimizers switch off).
class CompressedCommunication {
 public:
  virtual ~CompressedCommunication() = default;
  /// Whether the engine must average the gradients before the next step (warm-up), or leave
  /// them local because the optimizer's compressed all-reduce replaces that.
  virtual bool backward_allreduce_enabled() const = 0;
  /// The data-parallel group of the compressed all-reduce (default: comm::world()); set by
  /// the engine before the first step. Error-buffer sizes depend on its size.
  virtual void set_data_parallel_group(const comm::Group& group) = 0;
  /// Per-parameter state tensors that differ between ranks (the error-feedback buffers). The
  /// replicated state goes into the model-states file written by data-parallel rank 0; these
  /// go into one file per rank (see save_rank_local_state) so that a resume is exact.
  virtual std::vector<std::string> rank_local_state_names() const {
    return {"worker_error", "server_error"};
  }
  /// Whether the parameters themselves differ between ranks (0/1 Adam's local steps; float
  /// rounding also leaves them an ulp apart after a synchronization), so that each rank's
  /// checkpoint file must hold its own copy.
  virtual bool rank_local_parameters() const { return false; }
  /// Whether a 16-bit engine must give the optimizer one fp32 master per parameter (DeepSpeed's
  /// FP16_UnfusedOptimizer, which it uses for OnebitLamb: trust ratios are per parameter)
  /// rather than one flat fp32 master per param group (FP16_Optimizer, which it uses for
  /// OnebitAdam and ZeroOneAdam: their compression then runs over the flattened group).
  virtual bool per_parameter_masters() const { return false; }

  /// DeepSpeed's 'exp_avg_mask' param-group key: a tensor multiplied into the momentum of every
  /// parameter of param group `group` after each compressed all-reduce (Note [Momentum mask] in
  /// momentum_mask.cpp). 1-bit compression cannot send an exact zero, so elements whose
  /// momentum must stay zero (BERT's position embeddings beyond the trained sequence length,
  /// vocabulary rows the corpus never uses) need it. Its numel must equal each of the group's
  /// parameters' (it is viewed as the momentum's shape); values are usually 0/1. An undefined
  /// tensor removes it. Not saved in checkpoints: as in DeepSpeed, the mask the program sets
  /// wins over the one in effect when a checkpoint was saved. Usually set through
  /// ParamGroup::exp_avg_mask; a 16-bit engine re-registers it for the group's flat fp32
  /// master (padding masked).
  void set_exp_avg_mask(size_t group, at::Tensor mask);
  /// The mask of param group `group` (undefined when it has none).
  at::Tensor exp_avg_mask(size_t group) const;

 private:
  std::vector<at::Tensor> exp_avg_masks_;  // by param-group index
};

/// "onebit_error_feedback_dp_rank_<dp_rank>_mp_rank_<mp_rank as 2 digits>.pt".
std::string rank_local_state_file_name(int dp_rank, int mp_rank);
/// When `optimizer` is a 1-bit optimizer (a DsOptimizer and CompressedCommunication), writes
/// its rank-local state tensors to `tag_dir`/rank_local_state_file_name(...), keyed
/// "<parameter index>.<state name>" (and "<parameter index>.param" when the parameters are
/// rank-local); does nothing for other optimizers. `save_file` writes it (checkpoint::save
/// when empty; an engine passes its checkpoint writer).
void save_rank_local_state(torch::optim::Optimizer& optimizer, const std::string& tag_dir,
                           int dp_rank, int mp_rank,
                           const checkpoint::FileSaver& save_file = {});
/// Restores what save_rank_local_state wrote, after the optimizer's state dict was loaded.
/// Throws CheckpointError naming the file when it is missing or a tensor's shape differs
/// (e.g. saved with another data-parallel size).
void load_rank_local_state(torch::optim::Optimizer& optimizer, const std::string& tag_dir,
                           int dp_rank, int mp_rank);

/// DeepSpeed's OnebitAdam (1-bit Adam, arXiv:2102.02888). Warm-up (the first `freeze_step`
/// steps): Adam without bias correction on the engine's averaged gradients,
/// p -= lr * (m / (sqrt(v) + eps) + weight_decay * p). Compression stage: the variance v is
/// frozen, m = beta1 * m + (1 - beta1) * g on the LOCAL gradient, then m is averaged by the
/// compressed all-reduce with error feedback, and p is updated as above. State per parameter:
/// step, exp_avg, exp_avg_sq, worker_error (padded size), server_error (one chunk); all of it is
/// checkpointed, so a resume mid-compression continues bit-exactly. Unlike DeepSpeed there is no
/// first "initialization" step that updates nothing (see docs/onebit.md).
class OneBitAdam : public optim::DsOptimizer, public CompressedCommunication {
 public:
  OneBitAdam(std::vector<torch::optim::OptimizerParamGroup> groups, optim::GroupOptions defaults,
             OneBitSettings settings);

  std::string type_name() const override { return "OnebitAdam"; }
  std::vector<std::string> state_names() const override {
    return {"exp_avg", "exp_avg_sq", "worker_error", "server_error"};
  }
  bool backward_allreduce_enabled() const override;
  void set_data_parallel_group(const comm::Group& group) override { group_ = group; }
  const OneBitSettings& settings() const { return settings_; }
  /// Steps taken so far (the first parameter's state step; 0 before the first).
  int64_t completed_steps();

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const optim::GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
              const optim::GroupOptions& group) override;

 private:
  OneBitSettings settings_;
  comm::Group group_;
};

/// DeepSpeed's ZeroOneAdam (0/1 Adam, arXiv:2202.06009). Until `var_freeze_step`: the variance
/// is updated only on steps that are multiples of var_interval (which doubles after every
/// var_update_scaler such updates); on those steps the engine all-reduces the gradients in full
/// precision, on the others the local gradient goes through the compressed all-reduce and only
/// the momentum moves. After var_freeze_step the variance is frozen and the ranks take local
/// steps, accumulating their updates in momentum_accumulator; every local_step_interval steps
/// (doubling every local_step_scaler steps up to local_step_clipper) the accumulated updates are
/// averaged by the compressed all-reduce, and the momentum is rebuilt from them. The update is
/// p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), without bias correction. The error
/// buffers are zeroed once when the variance freezes.
class ZeroOneAdam : public optim::DsOptimizer, public CompressedCommunication {
 public:
  ZeroOneAdam(std::vector<torch::optim::OptimizerParamGroup> groups, optim::GroupOptions defaults,
              OneBitSettings settings);

  std::string type_name() const override { return "ZeroOneAdam"; }
  std::vector<std::string> state_names() const override {
    return {"exp_avg",      "exp_avg_sq",          "worker_error",       "server_error",
            "momentum_accumulator", "var_interval", "var_counter", "local_step_interval",
            "local_step_counter", "lrs"};
  }
  /// Between synchronizations the momentum and the accumulated updates are local too.
  std::vector<std::string> rank_local_state_names() const override {
    return {"worker_error", "server_error", "momentum_accumulator", "exp_avg"};
  }
  bool rank_local_parameters() const override { return true; }
  bool backward_allreduce_enabled() const override;
  void set_data_parallel_group(const comm::Group& group) override { group_ = group; }
  const OneBitSettings& settings() const { return settings_; }

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const optim::GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
              const optim::GroupOptions& group) override;

 private:
  OneBitSettings settings_;
  comm::Group group_;
};

/// DeepSpeed's OnebitLamb (1-bit LAMB, arXiv:2104.06069). Warm-up (the first `freeze_step`
/// steps): LAMB without bias correction on the averaged gradients, u = m / (sqrt(v) + eps) +
/// weight_decay * p, p -= lr * clamp(||p|| / ||u||, min_coeff, max_coeff) * u, while a running
/// average of the trust ratios (coeff_beta) is kept per parameter; the variance at freeze_step
/// is copied into exp_avg_sq_fresh. Compression stage: each parameter's local momentum is scaled
/// to a common magnitude (scaling_coeff, fixed at the first compressed step), all momenta are
/// averaged in ONE compressed all-reduce of the flattened momenta, the gradient is
/// reconstructed from the momentum change to keep exp_avg_sq_fresh current, and the trust ratio
/// is the frozen average times a factor max((sqrt(v) + eps) / (sqrt(v_fresh) + eps)), bounded by
/// factor_min / factor_max and by factor_threshold relative change per step. The flat error
/// buffers are held in the state of the first parameter.
class OneBitLamb : public optim::DsOptimizer, public CompressedCommunication {
 public:
  OneBitLamb(std::vector<torch::optim::OptimizerParamGroup> groups, optim::GroupOptions defaults,
             OneBitSettings settings);

  /// The whole step: the compression stage communicates all parameters at once.
  at::Tensor step(LossClosure closure = nullptr) override;

  std::string type_name() const override { return "OnebitLamb"; }
  std::vector<std::string> state_names() const override {
    return {"exp_avg",         "exp_avg_sq",  "exp_avg_sq_fresh", "lamb_coeff_freeze",
            "last_factor",     "scaling_coeff", "worker_error",   "server_error"};
  }
  bool backward_allreduce_enabled() const override;
  void set_data_parallel_group(const comm::Group& group) override { group_ = group; }
  bool per_parameter_masters() const override { return true; }
  const OneBitSettings& settings() const { return settings_; }
  /// The trust ratios of the last step, one per updated parameter (DeepSpeed's lamb_coeffs).
  const std::vector<double>& lamb_coeffs() const { return lamb_coeffs_; }

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const optim::GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
              const optim::GroupOptions& group) override;

 private:
  void warmup_update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
                     const optim::GroupOptions& group);
  void compressed_step();

  OneBitSettings settings_;
  comm::Group group_;
  std::vector<double> lamb_coeffs_;
};

/// The group's size for error-buffer layouts: `group` when valid, else the world (1 before
/// init_distributed).
int compression_world_size(const comm::Group& group);

}  // namespace deepspeed::onebit

// ZeRO stages 1 and 2 (reference §7.2-7.4), and stage 0 with fp16/bf16 parameters (one
// replicated "partition" holding everything, with fp32 master weights). Each optimizer param group is flattened into a
// FlatGroup; this rank's slice of it is the only parameter the inner optimizer sees, so the
// optimizer state exists for the owned slice alone. Gradients are reduced to their owners by
// PartitionedGradReducer: at the accumulation boundary only (stage 1) or in every backward,
// accumulating into the owned gradient partition (stage 2). After the step the updated slices
// are all-gathered back into every rank's flat buffer, which the model's parameters view.
//
// MoE: expert parameters get flat groups of their own (moe_param_groups.h), partitioned over
// their expert-data-parallel group and reduced over it by a reducer of their own, divided by the
// whole data-parallel size (Note [Expert flat groups]).
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/comm.h"
#include "deepspeed/muon.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"
#include "runtime/accelerator/accelerator.h"
#include "runtime/grad_clip.h"
#include "runtime/optim/scoped_grad_scale.h"
#include "runtime/precision/overflow_check.h"
#include "runtime/zero/flat_group.h"
#include "runtime/zero/host_offload.h"
#include "runtime/zero/bf16_optimizer_layout.h"
#include "runtime/zero/moe_param_groups.h"
#include "runtime/zero/muon_orthogonalizer.h"
#include "runtime/zero/partitioned_reducer.h"
#include "runtime/zero/flat_zero_optimizer.h"
#include "runtime/zero/fp32_grad_accumulator.h"
#include "runtime/zero/reducer_list.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::runtime {
namespace {

void check_config(const DeepSpeedConfig& cfg) {
  const auto& z = cfg.zero_optimization;
  const std::string stage = "ZeRO-" + std::to_string(z.stage);
  // Matches DeepSpeed's assertions for the reduce-scatter path (reference §7.1).
  DS_CHECK(!(z.reduce_scatter && cfg.gradient_predivide_factor != 1.0), ConfigError, cfg.source,
           ": gradient_predivide_factor != 1.0 is not yet supported with ", stage,
           " with reduce scatter enabled (zero_optimization.reduce_scatter)");
  DS_CHECK(!(z.reduce_scatter && cfg.prescale_gradients), ConfigError, cfg.source,
           ": pre-scale gradients is not yet supported with ", stage,
           " with reduce scatter enabled (prescale_gradients, zero_optimization.reduce_scatter)");
  DS_CHECK(z.allgather_bucket_size % 2 == 0, ConfigError, cfg.source,
           ": zero_optimization.allgather_bucket_size must be a multiple of "
           "nccl_start_alignment_factor, 2 (got ", z.allgather_bucket_size, ")");
  DS_CHECK(z.allgather_bucket_size > 0, ConfigError, cfg.source,
           ": zero_optimization.allgather_bucket_size must be positive");
}

// Note [Expert flat groups]
// Under expert parallelism a rank holds num_experts / ep_size experts, each replicated over its
// expert-data-parallel group (the ranks with the same expert-parallel rank). So an expert flat
// group is cut into edp_size partitions, reduced and re-gathered over that group, while dense
// groups use the data-parallel group. An expert's gradient sums the contributions of every
// data-parallel rank's tokens (the all-to-all brought them), so "mean" divides it by the
// data-parallel size, as DeepSpeed's average_tensor does: the same update whatever the ep_size.
// Every element, dense or expert, is owned by exactly one data-parallel rank, so the gradient
// norm stays one sum over the data-parallel group; replicated (16-bit stage 0), each
// expert-parallel rank holds different experts, and their squares are summed over the
// expert-parallel group.
class Stage12 final : public FlatZeroOptimizer {
 public:
  explicit Stage12(const ZeroContext& ctx)
      : FlatZeroOptimizer(static_cast<int>(ctx.config->zero_optimization.stage),
                          ctx.dp_group.rank(), ctx.dp_group.size()),
        config_(*ctx.config), optimizer_(ctx.optimizer),
        stage_(static_cast<int>(ctx.config->zero_optimization.stage)),
        dp_group_(ctx.dp_group), world_(dp_group_.size()), replicated_(stage_ == 0),
        model_dtype_(ctx.model_dtype), grad_accum_dtype_(ctx.grad_accum_dtype),
        master_dtype_(ctx.master_dtype), experts_(ctx.expert_params) {
    if (stage_ > 0) check_config(config_);
    // Matches DeepSpeed (engine.zero_cpu_offload): with stages 1/2, device "nvme" offloads to
    // host memory like "cpu"; only stage 3 swaps to files (check_supported() warns).
    offload_ = ctx.config->zero_optimization.optimizer_offload() != OffloadDevice::kNone;
    const auto& z = config_.zero_optimization;
    std::map<const void*, std::string> name_of;
    for (size_t i = 0; i < ctx.trainable_params.size(); ++i) {
      name_of[ctx.trainable_params[i].unsafeGetTensorImpl()] = ctx.param_names[i];
    }
    std::map<const void*, bool> seen;
    // A 1-bit optimizer (16-bit stage 0 only: the config refuses ZeRO for them) communicates by
    // itself once its warm-up ends; see use_onebit_masters for its masters.
    compressed_ = dynamic_cast<onebit::CompressedCommunication*>(optimizer_);
    if (compressed_ != nullptr) {
      DS_INTERNAL_ASSERT(stage_ == 0, "1-bit optimizers run at ZeRO stage 0 only");
      compressed_->set_data_parallel_group(dp_group_);
    }
    // DeepSpeed's MoE param groups: expert parameters leave their groups for groups of their own.
    const std::vector<int> expert_of = split_moe_param_groups(*optimizer_, experts_);
    use_moe_checkpoint(ctx.module, experts_, expert_of);
    // Under pipeline parallelism (stage 0) the model states keep the 16-bit stage-0 layout:
    // DeepSpeed 0.19's own load of its BF16_Optimizer there fails (it indexes the model states'
    // dict by rank). Its rank files are read all the same (read_bf16_optimizer_files).
    if (zero1_uses_bf16_optimizer(config_)) use_bf16_optimizer_checkpoint();
    size_t optimizer_group = 0;
    for (auto& group : optimizer_->param_groups()) {
      std::vector<at::Tensor> params;
      std::vector<std::string> names;
      for (auto& p : group.params()) {
        if (!p.requires_grad()) continue;  // frozen: stays a plain tensor, never stepped
        const void* key = p.unsafeGetTensorImpl();
        auto it = name_of.find(key);
        const std::string name = it == name_of.end() ? "<not a module parameter>" : it->second;
        DS_CHECK(!seen[key], ConfigError, "parameter '", name,
                 "' appears in more than one optimizer param group");
        seen[key] = true;
        DS_CHECK(p.scalar_type() == model_dtype_, UsageError, "parameter '", name, "' is ",
                 p.scalar_type(), " but the engine trains in ", model_dtype_,
                 " (fp16.enabled / bf16.enabled); keep every trainable parameter in that dtype");
        params.push_back(p);
        names.push_back(name);
      }
      if (params.empty()) {
        group.params().clear();
        ++optimizer_group;
        continue;
      }
      // ZeRO-Offload keeps masters and optimizer state in host memory next to parameters that
      // live on the accelerator (on CPU they are in host memory already, unless a test asks
      // for separate host buffers to cover that logic without a GPU).
      const bool host_masters =
          offload_ && (!params.front().device().is_cpu() || offload_host_path_on_cpu());
      if (host_masters && !host_) {
        host_ = std::make_unique<HostOffload>(params.front().device(), model_dtype_,
                                              master_dtype_, optimizer_);
      }
      FlatComm fc;
      fc.expert = expert_of[optimizer_group];
      fc.group = fc.expert < 0 ? dp_group_ : experts_[static_cast<size_t>(fc.expert)].expert_data_parallel;
      fc.partitions = replicated_ ? 1 : fc.group.size();
      fc.partition = replicated_ ? 0 : fc.group.rank();
      comm_.push_back(fc);
      groups_.emplace_back(std::move(params), std::move(names), fc.partitions, fc.partition,
                           z.round_robin_gradients);
      FlatGroup& fg = groups_.back();
      grad_partitions_.push_back(
          at::zeros({fg.partition_numel()}, fg.flat().options().dtype(grad_accum_dtype_)));
      // The owned slice is the inner optimizer's only parameter. For fp32 models (and 16-bit
      // masters, Note [Low-precision masters]) it is a view of the flat buffer itself, so the
      // update lands in the model's parameters directly; fp16/bf16 models get an fp32 master
      // copy that is written back after each step.
      at::Tensor master = fg.partition(fc.partition);
      if (host_) {
        master = host_->add_group(master);
      } else {
        if (model_dtype_ != master_dtype_) {
          master = master.to(fg.flat().options().dtype(master_dtype_), /*non_blocking=*/false,
                             /*copy=*/true);
          // The optimizer writes the model-dtype partition in the same pass as the update where
          // its kernel can (Note [Fused copy-out]); optimizer_step() copies where it did not.
          if (auto* ds = dynamic_cast<optim::DsOptimizer*>(optimizer_)) {
            if (compressed_ == nullptr) ds->set_copy_out(master, fg.partition(fc.partition));
          }
        }
        if (grad_accum_dtype_ == master_dtype_) master.mutable_grad() = grad_partitions_.back();
      }
      masters_.push_back(master);
      group.params() = {master};
      if (compressed_ != nullptr) use_onebit_masters(group, optimizer_group);
      use_muon_orthogonalizer(optimizer_group, groups_.size() - 1);
      ++optimizer_group;
    }
    std::vector<std::string> orphans;
    for (const auto& p : ctx.trainable_params) {
      if (!seen[p.unsafeGetTensorImpl()]) orphans.push_back(name_of[p.unsafeGetTensorImpl()]);
    }
    if (!orphans.empty()) {
      std::ostringstream os;
      os << orphans.size() << " trainable parameter(s) are in no optimizer param group and will "
         << "not be updated (first: '" << orphans.front() << "')";
      log::warn_rank0(os.str());
    }
    if (!groups_.empty()) {
      PartitionedReducerOptions ro;
      ro.average_divisor = ctx.average_divisor > 0 ? ctx.average_divisor : world_;
      ro.bucket_numel = z.reduce_bucket_numel();
      ro.overlap_comm = z.overlap_comm_enabled();
      // Matches DeepSpeed: CPU offload forces contiguous_gradients on.
      ro.contiguous_gradients = z.contiguous_gradients || offload_;
      ro.reduce_scatter = z.reduce_scatter;
      ro.multi_rank_bucket_allreduce = z.use_multi_rank_bucket_allreduce;
      ro.average = config_.gradient_allreduce_op == "mean";
      ro.prescale = config_.prescale_gradients;
      ro.predivide_factor = config_.gradient_predivide_factor;
      ro.ignore_unused_parameters = z.ignore_unused_parameters;
      ro.bucket_dtype = ctx.communication_dtype;
      ro.comm_dtypes = ctx.comm_dtypes;
      // One reducer per communication group: the dense flats', then each expert group's.
      for (int e = -1; e < static_cast<int>(experts_.size()); ++e) {
        PartitionedReducerOptions gro = ro;
        gro.group = e < 0 ? dp_group_ : experts_[static_cast<size_t>(e)].expert_data_parallel;
        for (size_t g = 0; g < groups_.size(); ++g) {
          if (comm_[g].expert == e) gro.flat_groups.push_back(g);
        }
        if (gro.flat_groups.empty()) continue;
        // Replicated (stage 0), or a group of one: a plain all-reduce.
        if (replicated_ || gro.group.size() == 1) gro.reduce_scatter = false;
        if (host_) {
          gro.on_reduced = [this](size_t g, int64_t offset, int64_t numel) {
            host_->on_reduced(g, grad_partitions_[g], offset, numel);
          };
        }
        reducers_.push_back(
            std::make_unique<PartitionedGradReducer>(&groups_, &grad_partitions_, gro));
      }
    }
    // Matches DeepSpeed's BF16_Optimizer (ZeRO 1 with fp32 gradient accumulation, and bf16
    // pipelines at stage 0): micro-steps summed in fp32 (Note [fp32 gradient accumulation]).
    const bool bf16_pipeline = ctx.pipeline && stage_ == 0 && model_dtype_ == at::kBFloat16;
    if ((zero1_uses_bf16_optimizer(config_) || bf16_pipeline) && !groups_.empty()) {
      fp32_sums_ =
          std::make_unique<Fp32GradAccumulator>(groups_, config_.bf16.immediate_grad_update);
    }
  }

  void begin_backward(bool boundary) override {
    // Stage 2 reduces every micro-step into the owned partition; stage 1 lets param.grad
    // accumulate and reduces once, on the boundary. A 1-bit optimizer past its warm-up wants
    // the local gradients (DeepSpeed's enable_backward_allreduce false).
    local_boundary_ = boundary && compressed_ != nullptr && !compressed_->backward_allreduce_enabled();
    // fp32 sums are reduced after backward, from end_backward.
    if ((stage_ == 2 || boundary) && !local_boundary_ && !fp32_sums_) {
      for (auto& r : reducers_) r->prepare();
    }
    if (host_) host_->begin_backward(boundary && !local_boundary_);
  }

  void end_backward(bool boundary) override {
    if (fp32_sums_) {
      fp32_sums_->accumulate();
      if (boundary) {
        fp32_sums_->lend_to_params();
        for (auto& r : reducers_) r->prepare();
      }
    }
    for (auto& r : reducers_) {
      if (r->armed()) r->finish();
    }
    if (local_boundary_) take_local_gradients();
    if (boundary) last_boundary_reduced_ = !local_boundary_;
    // Muon rewrote the device partitions after they went to the host: the step copies them.
    if (host_) host_->end_backward(boundary, !local_boundary_ && muon_groups_.empty());
    local_boundary_ = false;
  }

  void end_micro_batch_backward() override {
    if (fp32_sums_) fp32_sums_->accumulate();
  }

  at::Tensor fp32_grad_sum(const at::Tensor& param) override {
    return fp32_sums_ ? fp32_sums_->sum_for(param) : at::Tensor();
  }

  double grad_norm_squared() override {
    // Each rank sums the squares of what it owns (padding is zero); one small all-reduce. A
    // replicated partition (16-bit stage 0) is already the whole averaged gradient on every rank,
    // but for experts, which differ across the expert-parallel group (Note [Expert flat groups]).
    double dense = 0.0;
    std::vector<double> experts(experts_.size(), 0.0);
    for (size_t g = 0; g < groups_.size(); ++g) {
      const double sq = owned_squares(g);
      if (comm_[g].expert < 0) {
        dense += sq;
      } else {
        experts[static_cast<size_t>(comm_[g].expert)] += sq;
      }
    }
    if (replicated_) {
      for (size_t e = 0; e < experts_.size(); ++e) {
        if (experts_[e].expert_parallel.size() > 1) {
          experts[e] = sum_over_group(experts[e], experts_[e].expert_parallel);
        }
        dense += experts[e];
      }
      return dense;
    }
    for (double sq : experts) dense += sq;
    return world_ == 1 ? dense : sum_over_group(dense, dp_group_);
  }

  void exclude_from_norm(const std::vector<at::Tensor>& params) override {
    for (const auto& p : params) norm_excluded_.insert(p.unsafeGetTensorImpl());
  }

  void scale_gradients(double coef) override {
    // The coefficient goes where the step reads the gradients: the host copies (CPU-Adam applies
    // it as it reads them) or the device partitions, never both.
    if (host_ && host_->grads_on_host()) return host_->scale(coef);
    if (!host_ && ScopedGradScale::takes_scale(optimizer_)) {
      // A DeepSpeed optimizer scales each gradient as its step reads it (Note [Gradient scale
      // in the step]): CPU-Adam and the fused CUDA Adam in their kernels, saving a pass over
      // the partitions.
      step_grad_scale_ *= coef;
      return;
    }
    if (host_) host_->before_device_grad_write();
    for (auto& g : grad_partitions_) g.mul_(coef);
  }

  void optimizer_step() override {
    if (host_) {
      std::vector<at::Tensor> partitions;
      for (size_t g = 0; g < groups_.size(); ++g) {
        partitions.push_back(groups_[g].partition(comm_[g].partition));
      }
      host_->step(grad_partitions_, partitions);
      return gather_partitions();
    }
    // Gradients accumulated in another dtype reach the optimizer in the masters' (fp32, or
    // the 16-bit masters' own).
    if (grad_accum_dtype_ != master_dtype_) {
      for (size_t g = 0; g < masters_.size(); ++g) {
        masters_[g].mutable_grad() = grad_partitions_[g].to(master_dtype_);
      }
    }
    if (grad_accum_dtype_ != master_dtype_) {
      for (size_t g = 0; g < master_views_.size(); ++g) set_view_grads(g, masters_[g].grad());
    }
    {
      ScopedGradScale scale(optimizer_, step_grad_scale_);
      step_grad_scale_ = 1.0;  // it belongs to these gradients alone
      optimizer_->step();
    }
    if (grad_accum_dtype_ != master_dtype_) {
      for (auto& m : masters_) m.mutable_grad() = at::Tensor();
      for (size_t g = 0; g < master_views_.size(); ++g) set_view_grads(g, at::Tensor());
    }
    if (model_dtype_ != master_dtype_) {
      auto* ds = dynamic_cast<optim::DsOptimizer*>(optimizer_);
      for (size_t g = 0; g < groups_.size(); ++g) {
        if (ds != nullptr && ds->wrote_copy_out(masters_[g])) continue;
        groups_[g].partition(comm_[g].partition).copy_(masters_[g]);
      }
    }
    gather_partitions();
  }

  bool local_overflow() override {
    return has_inf_or_nan(grad_partitions_);
  }

  void zero_grad() override {
    if (host_) host_->before_device_grad_write();
    for (auto& g : grad_partitions_) g.zero_();
    if (fp32_sums_) fp32_sums_->zero();
    for (auto& fg : groups_) {
      for (const auto& s : fg.slots()) {
        at::Tensor param = s.param;  // a handle: the gradient belongs to the shared impl
        if (param.grad().defined()) param.mutable_grad() = at::Tensor();
      }
    }
  }

  ZeroMemory memory() const override {
    ZeroMemory m;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const FlatGroup& fg = groups_[g];
      m.param_bytes += fg.padded_numel() * static_cast<int64_t>(fg.flat().element_size());
      // Masters apart from the parameters: fp32 ones of a 16-bit model, or host copies.
      if (model_dtype_ != at::kFloat && (host_ || model_dtype_ != master_dtype_)) {
        m.master_param_bytes +=
            static_cast<int64_t>(c10::elementSize(master_dtype_)) * fg.partition_numel();
      }
      m.padding_elements += fg.padded_numel() - fg.numel();
      m.grad_bytes += grad_partitions_[g].numel() *
                      static_cast<int64_t>(grad_partitions_[g].element_size());
      // Gradients still held by the model (stage 1 between micro-steps).
      for (const auto& s : fg.slots()) {
        if (s.param.grad().defined()) {
          m.grad_bytes += s.param.grad().numel() * static_cast<int64_t>(s.param.element_size());
        }
      }
    }
    if (fp32_sums_) m.grad_bytes += fp32_sums_->bytes();
    m.optimizer_state_bytes = optimizer_state_bytes(*optimizer_);
    if (offload_) m.offloaded_optimizer_bytes = m.optimizer_state_bytes + m.master_param_bytes;
    for (const auto& r : reducers_) m.bucket_bytes += r->buffer_bytes();
    return m;
  }

  ReductionStats reduction_stats() const override {
    ReductionStats s;
    if (!last_boundary_reduced_) return s;
    for (const auto& r : reducers_) {
      const ReductionStats rs = r->stats();
      s.buckets_launched += rs.buckets_launched;
      s.buckets_launched_from_hooks += rs.buckets_launched_from_hooks;
      s.reductions_issued += rs.reductions_issued;
    }
    if (host_) s.host_copies_in_backward = host_->copies_in_backward();
    return s;
  }
  int64_t num_buckets() const override { return total_buckets(reducers_); }
  bool backward_pending() const override { return any_armed(reducers_); }

  std::vector<FlatGroupLayout> flat_layout() const override {
    std::vector<FlatGroupLayout> out;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const FlatGroup& fg = groups_[g];
      FlatGroupLayout layout;
      for (const auto& s : fg.slots()) layout.params.emplace_back(s.name, s.param.sizes().vec());
      layout.numel = fg.numel();
      layout.partition_numel = fg.partition_numel();
      layout.partitions = comm_[g].partitions;
      layout.partition = comm_[g].partition;
      if (comm_[g].expert >= 0) layout.expert_group = experts_[static_cast<size_t>(comm_[g].expert)].name;
      out.push_back(std::move(layout));
    }
    return out;
  }

  at::Tensor master_partition(size_t g) override { return masters_.at(g); }

  void params_to_masters() override {
    at::NoGradGuard no_grad;
    // Without host masters an fp32 model's (or 16-bit masters') are the parameters' memory.
    if (model_dtype_ == master_dtype_ && !host_) return;
    for (size_t g = 0; g < groups_.size(); ++g) {
      masters_[g].copy_(groups_[g].partition(comm_[g].partition));
    }
  }

  void masters_to_params() override {
    at::NoGradGuard no_grad;
    if (model_dtype_ == master_dtype_ && !host_) return;
    for (size_t g = 0; g < groups_.size(); ++g) {
      groups_[g].partition(comm_[g].partition).copy_(masters_[g]);
    }
  }

 private:
  // The inner optimizer's parameters for a 1-bit optimizer. DeepSpeed wraps OnebitAdam and
  // ZeroOneAdam in FP16_Optimizer (one flat fp32 master per group, which is ours as it is) and
  // OnebitLamb in FP16_UnfusedOptimizer (one fp32 master per parameter): for those the group
  // gets views of the flat master, one per parameter in its shape, with views of the gradient
  // partition as their gradients. A group's exp_avg_mask (one per parameter's numel) becomes
  // the flat master's mask (padding masked) or stays as it is for the views.
  // Muon's groups step orthogonalized gradients (muon_orthogonalizer.h): flat group `g`, the
  // inner optimizer's group `optimizer_group`, gets them from orthogonalize_muon_gradients().
  void use_muon_orthogonalizer(size_t optimizer_group, size_t g) {
    auto* muon = dynamic_cast<optim::Muon*>(optimizer_);
    if (muon == nullptr || !optim::Muon::is_muon_group(muon->group_options(optimizer_group))) {
      return;
    }
    muon->mark_orthogonalized(masters_[g]);
    muon_groups_.emplace_back(g, optimizer_group);
  }

  void before_grad_norm(double loss_scale) override {
    if (last_boundary_reduced_) orthogonalize_muon_gradients(loss_scale);
  }

  void orthogonalize_muon_gradients(double loss_scale) {
    auto* muon = dynamic_cast<optim::Muon*>(optimizer_);
    for (auto& [g, optimizer_group] : muon_groups_) {
      // Looked up each time: loading a checkpoint replaces the groups' options.
      const optim::GroupOptions& options = muon->group_options(optimizer_group);
      at::Tensor& momentum =
          muon->get_or_create_state(masters_[g], options).tensor("momentum_buffer");
      orthogonalize_muon_partition(groups_[g], grad_partitions_[g], momentum,
                                   options.number("momentum"),
                                   optim::parse_ns_method(options.text("ns_method"), "ns_method"),
                                   loss_scale, comm_[g].group);
    }
  }

  void use_onebit_masters(torch::optim::OptimizerParamGroup& group, size_t optimizer_group) {
    const size_t g = groups_.size() - 1;
    const FlatGroup& fg = groups_[g];
    const at::Tensor mask = compressed_->exp_avg_mask(optimizer_group);
    if (compressed_->per_parameter_masters()) {
      master_views_.resize(groups_.size());
      std::vector<at::Tensor> views;
      for (const auto& s : fg.slots()) {
        views.push_back(masters_[g].narrow(0, s.offset, s.numel).view(s.param.sizes()));
      }
      master_views_[g] = views;
      if (grad_accum_dtype_ == at::kFloat) set_view_grads(g, grad_partitions_[g]);
      group.params() = std::move(views);
      return;
    }
    if (!mask.defined()) return;
    at::Tensor flat_mask = at::zeros({fg.partition_numel()}, mask.options());
    for (const auto& s : fg.slots()) {
      flat_mask.narrow(0, s.offset, s.numel).copy_(mask.reshape({-1}));
    }
    compressed_->set_exp_avg_mask(optimizer_group, flat_mask);
  }

  // Points the per-parameter master views of group g at `flat_grad` (undefined: no gradient).
  void set_view_grads(size_t g, const at::Tensor& flat_grad) {
    for (size_t i = 0; i < master_views_[g].size(); ++i) {
      const FlatSlot& s = groups_[g].slots()[i];
      master_views_[g][i].mutable_grad() =
          flat_grad.defined() ? flat_grad.narrow(0, s.offset, s.numel).view(s.param.sizes())
                              : at::Tensor();
    }
  }

  // A boundary left to a 1-bit optimizer: each rank's own (accumulated) gradients go into the
  // replicated gradient partition unreduced, where the reducer would have put the average.
  void take_local_gradients() {
    at::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const auto& s : groups_[g].slots()) {
        at::Tensor param = s.param;  // a handle: the gradient belongs to the shared impl
        at::Tensor dst = grad_partitions_[g].narrow(0, s.offset, s.numel);
        if (param.grad().defined()) {
          dst.copy_(param.grad().reshape({-1}));
        } else {
          dst.zero_();  // unused this step: a zero gradient, as the reducer gives it
        }
        param.mutable_grad() = at::Tensor();
      }
    }
  }

  // This rank's squared gradient norm over what it owns of flat group g (padding is zero),
  // less the parameters exclude_from_norm left out.
  double owned_squares(size_t g) const {
    if (norm_excluded_.empty()) return squared_l2_norm(grad_partitions_[g]);
    std::vector<at::Tensor> counted;
    for (const auto& piece : groups_[g].owned_pieces()) {
      const at::Tensor& p = groups_[g].slots()[piece.slot].param;
      if (norm_excluded_.count(p.unsafeGetTensorImpl())) continue;
      counted.push_back(grad_partitions_[g].narrow(0, piece.partition_offset, piece.numel));
    }
    return squared_l2_norm(counted);
  }

  // Re-replicates the parameters: every rank's updated slice into every rank's flat buffer, in
  // shards of about allgather_bucket_size elements in total (reference §7.4 step 4), by
  // all-gather (allgather_partitions) or by one broadcast per owner. Each flat group over its
  // own group (an expert group's over its expert-data-parallel group).
  void gather_partitions() {
    const auto& z = config_.zero_optimization;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const FlatComm& fc = comm_[g];
      if (fc.partitions == 1) continue;
      FlatGroup& fg = groups_[g];
      const int64_t p = fg.partition_numel();
      const int64_t shards = std::max<int64_t>(1, p * fc.partitions / z.allgather_bucket_size);
      int64_t shard = std::max<int64_t>(2, (p / shards) & ~int64_t{1});
      for (int64_t start = 0; start < p; start += shard) {
        const int64_t len = std::min(shard, p - start);
        std::vector<at::Tensor> outs;
        for (int r = 0; r < fc.partitions; ++r) {
          outs.push_back(fg.flat().narrow(0, static_cast<int64_t>(r) * p + start, len));
        }
        if (z.allgather_partitions) {
          comm::all_gather(outs, outs[static_cast<size_t>(fc.partition)], false, fc.group);
        } else {
          for (int r = 0; r < fc.partitions; ++r) {
            comm::broadcast(outs[static_cast<size_t>(r)], fc.group.global_rank(r), false,
                            fc.group);
          }
        }
      }
    }
  }

  const DeepSpeedConfig& config_;
  torch::optim::Optimizer* optimizer_;
  int stage_;
  comm::Group dp_group_;
  int world_;        // data-parallel size
  bool replicated_;  // stage 0 in fp16/bf16: one partition holding everything, on every rank
  at::ScalarType model_dtype_;
  at::ScalarType grad_accum_dtype_;  // dtype of the gradient partitions
  std::unique_ptr<Fp32GradAccumulator> fp32_sums_;  // BF16_Optimizer's micro-step sums
  at::ScalarType master_dtype_;      // fp32, or 16-bit (Note [Low-precision masters])
  double step_grad_scale_ = 1.0;     // scale_gradients' coefficient, for the optimizer's step
  std::vector<ExpertParams> experts_;  // MoE expert groups; empty without MoE layers
  // Who a flat group is partitioned over and reduced with.
  struct FlatComm {
    comm::Group group;   // the data-parallel group, or an expert group's expert-data-parallel one
    int partitions = 1;  // group's size for stages 1/2; 1 when replicated
    int partition = 0;   // the slice this rank owns
    int expert = -1;     // index in experts_; -1 for a dense group
  };
  std::vector<FlatComm> comm_;  // per flat group
  // Muon's flat groups, each with its inner optimizer param group.
  std::vector<std::pair<size_t, size_t>> muon_groups_;
  bool offload_ = false;  // offload_optimizer.device "cpu" or "nvme" (docs/offload.md)
  // Offload with the parameters on a GPU: the host masters and gradients (host_offload.h).
  std::unique_ptr<HostOffload> host_;
  std::vector<FlatGroup> groups_;
  std::set<const void*> norm_excluded_;  // parameters left out of grad_norm_squared()
  std::vector<at::Tensor> grad_partitions_;
  std::vector<at::Tensor> masters_;
  std::vector<std::unique_ptr<PartitionedGradReducer>> reducers_;  // dense, then per expert group
  onebit::CompressedCommunication* compressed_ = nullptr;  // a 1-bit optimizer, else null
  std::vector<std::vector<at::Tensor>> master_views_;  // per group: per-parameter fp32 masters
  bool local_boundary_ = false;        // this backward's gradients stay local (1-bit optimizer)
  bool last_boundary_reduced_ = true;  // false after a boundary left to a 1-bit optimizer
};

}  // namespace

std::unique_ptr<ZeroOptimizer> make_stage1_2(const ZeroContext& context) {
  return std::make_unique<Stage12>(context);
}

}  // namespace deepspeed::runtime

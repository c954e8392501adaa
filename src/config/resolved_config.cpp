// DeepSpeedConfig::resolved(): the effective configuration as JSON (defaults applied, the batch
// triad filled in), printed by `ds_config` and at engine start with dump_state.
#include "config/auto_sizes.h"
#include "config/feature_sections.h"
#include "deepspeed/config.h"

namespace deepspeed {
namespace {

json offload_optimizer_json(const OffloadOptimizerConfig& o) {
  return {{"device", offload_device_name(o.device)},       {"nvme_path", o.nvme_path},
          {"buffer_count", o.buffer_count}, {"pin_memory", o.pin_memory},
          {"pipeline_read", o.pipeline_read}, {"pipeline_write", o.pipeline_write},
          {"fast_init", o.fast_init}, {"ratio", o.ratio},
          {"super_offload", o.super_offload}, {"cpuadam_cores_perc", o.cpuadam_cores_perc}};
}

json offload_param_json(const OffloadParamConfig& o) {
  return {{"device", offload_device_name(o.device)},         {"nvme_path", o.nvme_path},
          {"buffer_count", o.buffer_count}, {"buffer_size", o.buffer_size},
          {"max_in_cpu", o.max_in_cpu}, {"pin_memory", o.pin_memory}};
}

json zero_json(const ZeroConfig& z) {
  json j = {{"stage", z.stage},
            {"contiguous_gradients", z.contiguous_gradients},
            {"reduce_scatter", z.reduce_scatter},
            {"reduce_bucket_size", z.reduce_bucket_size},
            {"use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce},
            {"allgather_partitions", z.allgather_partitions},
            {"allgather_bucket_size", z.allgather_bucket_size},
            {"overlap_comm", z.overlap_comm_enabled()},
            {"load_from_fp32_weights", z.load_from_fp32_weights},
            {"elastic_checkpoint", z.elastic_checkpoint},
            {"offload_param", z.offload_param ? offload_param_json(*z.offload_param) : json()},
            {"offload_optimizer",
             z.offload_optimizer ? offload_optimizer_json(*z.offload_optimizer) : json()},
            {"sub_group_size", z.sub_group_size},
            {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
            {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
            {"stage3_model_persistence_threshold", z.stage3_model_persistence_threshold},
            {"stage3_max_live_parameters", z.stage3_max_live_parameters},
            {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
            {"stage3_gather_16bit_weights_on_model_save",
             z.stage3_gather_16bit_weights_on_model_save},
            {"stage3_module_granularity_threshold", z.stage3_module_granularity_threshold},
            {"stage3_use_all_reduce_for_fetch_params", z.stage3_use_all_reduce_for_fetch_params},
            {"stage3_allgather_sequential", z.stage3_allgather_sequential},
            {"ignore_unused_parameters", z.ignore_unused_parameters},
            {"round_robin_gradients", z.round_robin_gradients},
            {"zero_hpz_partition_size", z.zero_hpz_partition_size},
            {"zero_quantized_weights", z.zero_quantized_weights},
            {"zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights},
            {"zero_quantized_gradients", z.zero_quantized_gradients},
            {"mics_shard_size", z.mics_shard_size},
            {"mics_hierarchical_params_gather", z.mics_hierarchical_params_gather},
            {"memory_efficient_linear", z.memory_efficient_linear},
            {"override_module_apply", z.override_module_apply},
            {"pipeline_loading_checkpoint", z.pipeline_loading_checkpoint},
            {"log_trace_cache_warnings", z.log_trace_cache_warnings},
            {"enable_sanity_checks", z.enable_sanity_checks}};
  if (z.zeropp_loco_param) {
    j["zeropp_loco_param"] = {{"err_beta", z.zeropp_loco_param->err_beta},
                              {"reset_T", z.zeropp_loco_param->reset_T}};
  }
  // "auto" sizes not resolved yet (no model here): the formula initialize() will apply.
  for (const auto& key : z.auto_sizes) j[key] = config_detail::unresolved_auto_size(key);
  return j;
}

json monitor_json(const MonitorConfig& m) {
  return {{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
}

}  // namespace

json DeepSpeedConfig::resolved() const {
  json j;
  j["train_batch_size"] = batch.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = batch.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = batch.gradient_accumulation_steps;
  j["data_parallel_world_size"] = batch.dp_world_size;
  if (optimizer.present) {
    j["optimizer"] = {{"type", optimizer.type}, {"params", optimizer.params}};
  } else {
    j["optimizer"] = nullptr;
  }
  if (scheduler.present) {
    j["scheduler"] = {{"type", scheduler.type}, {"params", scheduler.params}};
  } else {
    j["scheduler"] = nullptr;
  }
  j["gradient_clipping"] = gradient_clipping;
  j["steps_per_print"] = steps_per_print ? json(*steps_per_print) : json();
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  j["memory_breakdown"] = memory_breakdown;
  j["dump_state"] = dump_state;
  j["prescale_gradients"] = prescale_gradients;
  j["gradient_predivide_factor"] = gradient_predivide_factor;
  j["gradient_allreduce_op"] = gradient_allreduce_op;
  j["communication_data_type"] =
      communication_data_type ? json(*communication_data_type) : json();
  j["sequence_parallel_size"] = sequence_parallel_size;
  j["seq_parallel_communication_data_type"] = seq_parallel_communication_data_type;
  j["data_parallel_size"] = data_parallel_size ? json(*data_parallel_size) : json();
  j["managed_gradient_accumulation"] = managed_gradient_accumulation;
  j["zero_allow_untested_optimizer"] = zero_allow_untested_optimizer;
  j["zero_force_ds_cpu_optimizer"] = zero_force_ds_cpu_optimizer;
  j["dataloader_drop_last"] = dataloader_drop_last;
  j["sparse_gradients"] = sparse_gradients;
  j["seed"] = seed ? json(*seed) : json();
  j["fp16"] = {{"enabled", fp16.enabled},
               {"auto_cast", fp16.auto_cast},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale},
               {"fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads}};
  j["bf16"] = {{"enabled", bf16.enabled},
               {"immediate_grad_update", bf16.immediate_grad_update},
               {"check_grad_overflow", bf16.check_grad_overflow},
               {"bf16_master_weights_and_grads", bf16.bf16_master_weights_and_grads},
               {"bf16_optimizer_states", bf16.bf16_optimizer_states}};
  j["zero_optimization"] = zero_json(zero_optimization);
  j["tensorboard"] = monitor_json(tensorboard);
  j["csv_monitor"] = monitor_json(csv_monitor);
  j["wandb"] = {{"enabled", wandb.enabled}, {"group", wandb.group}, {"team", wandb.team},
                {"project", wandb.project}};
  j["comms_logger"] = {{"enabled", comms_logger.enabled}, {"verbose", comms_logger.verbose},
                       {"prof_all", comms_logger.prof_all}, {"prof_ops", comms_logger.prof_ops},
                       {"debug", comms_logger.debug}};
  j["timers"] = {{"throughput", {{"enabled", timers_throughput.enabled},
                                 {"synchronized", timers_throughput.synchronized}}}};
  j["checkpoint"] = {{"tag_validation", checkpoint.tag_validation},
                     {"load_universal", checkpoint.load_universal},
                     {"use_node_local_storage", checkpoint.use_node_local_storage},
                     {"parallel_write", {{"pipeline_stage", checkpoint.parallel_write_pipeline_stage}}}};
  config_detail::resolve_feature_sections(*this, j);
  // Sections kept verbatim (parsed by their features, which judge them in check_supported()).
  for (auto it = raw.begin(); it != raw.end(); ++it) {
    if (!j.contains(it.key()) && it.key() != "bfloat16" && it.key() != "timers") {
      j[it.key()] = it.value();
    }
  }
  return j;
}

}  // namespace deepspeed

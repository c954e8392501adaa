// DeepSpeedConfig: sections, defaults, type errors with key paths, unknown keys, refusals.
#include "deepspeed/config.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed {
namespace {

DeepSpeedConfig parse(const std::string& text, int64_t world = 1) {
  return DeepSpeedConfig::from_string(text, world);
}

TEST(DsConfig, DefaultsMatchDeepSpeed) {
  auto c = parse(R"({"train_batch_size": 8})");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.steps_per_print.has_value());
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_EQ(c.gradient_allreduce_op, "mean");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_FALSE(c.zero_optimization.overlap_comm_enabled());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_TRUE(c.bf16.check_grad_overflow);
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.checkpoint.tag_validation, "WARN");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_NO_THROW(c.check_supported());
}

TEST(DsConfig, ReadsImplementedTopLevelKeys) {
  auto c = parse(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "gradient_clipping": 0.5, "steps_per_print": 5, "wall_clock_breakdown": true,
    "prescale_gradients": true, "gradient_predivide_factor": 2.0, "seed": 7,
    "gradient_allreduce_op": "SUM", "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e5}
  })", 2);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.params["lr"].get<double>(), 3e-4);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(*c.steps_per_print, 5);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 2.0);
  EXPECT_EQ(*c.seed, 7);
  EXPECT_EQ(c.gradient_allreduce_op, "sum");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000);
  EXPECT_NO_THROW(c.check_supported());
}

TEST(DsConfig, AutoWithoutADerivableValueIsRefusedNamingTheKey) {
  // Hugging Face's placeholders: no number can be derived here, so each is an error by key path
  // (it used to read as the default: an HF config with "gradient_clipping": "auto" clipped at 1).
  const std::string hint = "\"auto\" is a placeholder that the Hugging Face integration fills in";
  for (auto [text, key] : {
           std::pair{R"({"train_batch_size": 8, "gradient_clipping": "auto"})",
                     "ds_config: gradient_clipping is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})",
                     "ds_config: fp16.enabled is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "bf16": {"enabled": "auto"}})",
                     "ds_config: bf16.enabled is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "bfloat16": {"enabled": "auto"}})",
                     "ds_config: bfloat16.enabled is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto"}})",
                     "ds_config: zero_optimization.stage is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": "auto"}})",
                     "ds_config: zero_optimization.sub_group_size is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "amp": {"enabled": "auto"}})",
                     "ds_config: amp.enabled is \"auto\""}}) {
    EXPECT_THROW_WITH(parse(text), ConfigError, key);
    EXPECT_THROW_WITH(parse(text), ConfigError, hint);
  }
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "gradient_clipping": "auto"})"), ConfigError,
                    "give a number here");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})"), ConfigError,
                    "give true or false here");
}

TEST(DsConfig, AutoInOptimizerAndSchedulerParamsIsRefusedByCheckSupported) {
  auto c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                     "params": {"lr": "auto", "weight_decay": 0.1}}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError,
                    "ds_config: optimizer.params.lr is \"auto\"; \"auto\" is a placeholder");
  c = parse(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                "params": {"warmup_num_steps": "auto"}}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError,
                    "ds_config: scheduler.params.warmup_num_steps is \"auto\"");
}

TEST(DsConfig, PipelineStagesAutoIsDeepSpeedsOwnValue) {
  auto c = parse(R"({"train_batch_size": 8, "pipeline": {"stages": "auto"}})");
  EXPECT_EQ(c.pipeline.stages, "auto");
  EXPECT_TRUE(c.notes.empty());
}

TEST(DsConfig, WrongTypeNamesKeyPathAndValue) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": "eight"})"), ConfigError,
                    "ds_config: train_batch_size is \"eight\"; expected an integer");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "fp16": {"enabled": "yes"}})"),
                    ConfigError, "fp16.enabled is \"yes\"; expected true or false");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1.5}})"),
                    ConfigError, "zero_optimization.reduce_bucket_size is 1.5; expected an integer");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "gradient_clipping": -1})"), ConfigError,
                    "gradient_clipping is negative");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})"),
                    ConfigError, "zero_optimization.stage is 4; expected 0, 1, 2 or 3");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"allgather_bucket_size": 3}})"),
                    ConfigError, "allgather_bucket_size is 3; it must be a multiple of 2");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "gradient_allreduce_op": "avg"})"),
                    ConfigError, "gradient_allreduce_op is \"avg\"; expected one of mean, sum");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "communication_data_type": "fp8"})"),
                    ConfigError, "communication_data_type is \"fp8\"");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "fp16": true})"), ConfigError,
                    "fp16 is true; expected an object");
}

TEST(DsConfig, UnknownKeyInStrictSectionIsErrorWithCloseMatch) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stgae": 1}})"),
                    ConfigError, "zero_optimization.stgae is not a known key; did you mean 'stage'?");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "fp16": {"initial_scale_pow": 8}})"),
                    ConfigError, "did you mean 'initial_scale_power'?");
  EXPECT_THROW_WITH(
      parse(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"devise": "cpu"}}})"),
      ConfigError, "zero_optimization.offload_optimizer.devise is not a known key");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "comms_logger": {"enable": true}})"),
                    ConfigError, "comms_logger.enable");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "tensorboard": {"path": "x"}})"),
                    ConfigError, "tensorboard.path");
}

TEST(DsConfig, UnknownTopLevelKeyIsWarningWithCloseMatch) {
  auto c = parse(R"({"train_batch_size": 8, "gradient_cliping": 1.0, "my_own_key": 3})");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("gradient_cliping is not a known key; did you mean "
                               "'gradient_clipping'?"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("my_own_key"), std::string::npos);
}

// Matches DeepSpeed, where only BF16_Optimizer (ZeRO 1 with fp32 gradient accumulation and no
// offload; bf16 pipelines) reads bf16.immediate_grad_update: elsewhere said to have no effect,
// not silently ignored.
TEST(DsConfig, ImmediateGradUpdateWithoutEffectIsAWarning) {
  EXPECT_TRUE(parse(R"({"train_batch_size": 8, "bf16": {"enabled": true,
      "immediate_grad_update": true}, "zero_optimization": {"stage": 1},
      "data_types": {"grad_accum_dtype": "fp32"}})").warnings.empty());
  const std::string idle = "bf16.immediate_grad_update has no effect here";
  for (const char* text : {
           R"({"train_batch_size": 8, "bf16": {"enabled": true, "immediate_grad_update": true},
               "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"}})",
           R"({"train_batch_size": 8, "bf16": {"enabled": true, "immediate_grad_update": true},
               "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "bf16"}})",
           R"({"train_batch_size": 8, "bf16": {"enabled": true, "immediate_grad_update": true},
               "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
               "data_types": {"grad_accum_dtype": "fp32"}})"}) {
    const auto c = parse(text);
    ASSERT_EQ(c.warnings.size(), 1u) << text;
    EXPECT_NE(c.warnings[0].find(idle), std::string::npos) << c.warnings[0];
  }
  // Stage 0: a bf16 pipeline uses it; the engine, which knows, warns outside one.
  EXPECT_TRUE(parse(R"({"train_batch_size": 8, "bf16": {"enabled": true,
      "immediate_grad_update": true}})").warnings.empty());
  const auto off = parse(R"({"train_batch_size": 8, "bf16": {"immediate_grad_update": true}})");
  ASSERT_EQ(off.warnings.size(), 1u);
  EXPECT_NE(off.warnings[0].find("bf16.immediate_grad_update has no effect without "
                                 "bf16.enabled"), std::string::npos) << off.warnings[0];
}

// Matches DeepSpeed, which reads MiCS' and hpZ's keys at stage 3 only: said, not silently
// ignored.
TEST(DsConfig, MicsAndHpzKeysWithoutEffectAreWarnings) {
  auto below = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "mics_shard_size": 2}})");
  ASSERT_EQ(below.warnings.size(), 1u);
  EXPECT_NE(below.warnings[0].find("zero_optimization.mics_shard_size has no effect with ZeRO "
                                   "stage 2"), std::string::npos) << below.warnings[0];
  auto alone = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "mics_hierarchical_params_gather": true}})");
  ASSERT_EQ(alone.warnings.size(), 1u);
  EXPECT_NE(alone.warnings[0].find("mics_hierarchical_params_gather has no effect without "
                                   "mics_shard_size > 0"), std::string::npos) << alone.warnings[0];
  EXPECT_TRUE(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "mics_shard_size": 2}})").warnings.empty());
  auto hpz = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
      "zero_hpz_partition_size": 2}})");
  ASSERT_EQ(hpz.warnings.size(), 1u);
  EXPECT_NE(hpz.warnings[0].find("zero_optimization.zero_hpz_partition_size has no effect with "
                                 "ZeRO stage 1"), std::string::npos) << hpz.warnings[0];
  // ZeRO++'s quantization keys likewise, each by name.
  auto quantized = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "zero_quantized_weights": true, "zero_quantized_nontrainable_weights": true,
      "zero_quantized_gradients": true}})");
  ASSERT_EQ(quantized.warnings.size(), 3u);
  for (const char* key : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients"}) {
    const std::string want = std::string("zero_optimization.") + key + " has no effect with ZeRO "
                             "stage 2";
    EXPECT_TRUE(std::any_of(quantized.warnings.begin(), quantized.warnings.end(),
                            [&](const std::string& w) { return w.find(want) != w.npos; }))
        << want;
  }
  EXPECT_NO_THROW(quantized.check_supported());
  EXPECT_TRUE(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "zero_quantized_weights": true, "zero_quantized_gradients": true}})").warnings.empty());
  auto loco = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024}}})");
  ASSERT_EQ(loco.warnings.size(), 1u);
  EXPECT_NE(loco.warnings[0].find("zero_optimization.zeropp_loco_param has no effect without "
                                  "zero_quantized_gradients"), std::string::npos)
      << loco.warnings[0];
  EXPECT_NO_THROW(loco.check_supported());
}

TEST(DsConfig, LocoParamIsReadWithQuantizedGradients) {
  const std::string head = R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "zero_quantized_gradients": true, "zeropp_loco_param": )";
  auto loco = parse(head + R"({"err_beta": 0.5, "reset_T": 16}}})");
  ASSERT_TRUE(loco.zero_optimization.zeropp_loco_param.has_value());
  EXPECT_EQ(loco.zero_optimization.zeropp_loco_param->err_beta, 0.5);
  EXPECT_EQ(loco.zero_optimization.zeropp_loco_param->reset_T, 16);
  EXPECT_TRUE(loco.warnings.empty());
  EXPECT_NO_THROW(loco.check_supported());
  EXPECT_FALSE(parse(head + "null}}").zero_optimization.zeropp_loco_param.has_value());
  EXPECT_THROW_WITH(parse(head + R"({"err_beta": 0.8}}})"), ConfigError,
                    "zero_optimization.zeropp_loco_param.reset_T is missing");
  EXPECT_THROW_WITH(parse(head + R"({"reset_T": 8}}})"), ConfigError,
                    "zero_optimization.zeropp_loco_param.err_beta is missing");
  EXPECT_THROW_WITH(parse(head + R"({"err_beta": 1.5, "reset_T": 8}}})"), ConfigError,
                    "zero_optimization.zeropp_loco_param.err_beta is 1.5");
  EXPECT_THROW_WITH(parse(head + R"({"err_beta": 0.8, "reset_T": -1}}})"), ConfigError,
                    "zero_optimization.zeropp_loco_param.reset_T");
  auto typo = parse(head + R"({"err_beta": 0.8, "reset_T": 8, "reset_t": 4}}})");
  ASSERT_EQ(typo.warnings.size(), 1u);
  EXPECT_NE(typo.warnings[0].find("zero_optimization.zeropp_loco_param.reset_t is not a known "
                                  "key"), std::string::npos) << typo.warnings[0];
}

TEST(DsConfig, ElasticCheckpointIsZeroOneAndTwosLayout) {
  for (int stage : {1, 2}) {
    auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                   std::to_string(stage) + R"(, "elastic_checkpoint": true}})");
    EXPECT_TRUE(c.zero_optimization.elastic_checkpoint);
    EXPECT_TRUE(c.warnings.empty());
    EXPECT_NO_THROW(c.check_supported());
  }
  auto stage0 = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 0,
      "elastic_checkpoint": true}})");
  ASSERT_EQ(stage0.warnings.size(), 1u);
  EXPECT_NE(stage0.warnings[0].find("zero_optimization.elastic_checkpoint has no effect with "
                                    "ZeRO stage 0"), std::string::npos) << stage0.warnings[0];
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
      "elastic_checkpoint": 1}})"), ConfigError, "zero_optimization.elastic_checkpoint");
}

TEST(DsConfig, CheckpointWritersOfDeepSpeedThatAreNotOursWarnByName) {
  auto c = parse(R"({"train_batch_size": 8, "checkpoint": {"use_node_local_storage": true,
      "parallel_write": {"pipeline_stage": true}}})");
  EXPECT_TRUE(c.checkpoint.use_node_local_storage);
  EXPECT_TRUE(c.checkpoint.parallel_write_pipeline_stage);
  EXPECT_FALSE(c.checkpoint.writer.has_value());
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(parse(R"({"train_batch_size": 8, "checkpoint": {"checkpoint_serialization": true,
      "writer": null}})").warnings.empty());
  c = parse(R"({"train_batch_size": 8, "checkpoint": {"checkpoint_serialization": false,
      "writer": {"type": "fast", "decoupled": true, "data_parallel": "socket",
                 "io_multiplier": 2}}})");
  ASSERT_EQ(c.warnings.size(), 3u);
  EXPECT_NE(c.warnings[0].find("checkpoint.checkpoint_serialization false"), std::string::npos)
      << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("checkpoint.writer.data_parallel \"SOCKET\""), std::string::npos)
      << c.warnings[1];
  EXPECT_NE(c.warnings[2].find("checkpoint.writer.io_multiplier"), std::string::npos)
      << c.warnings[2];
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"parallel_write":
      {"pipeline_stage": "yes"}}})"), ConfigError, "checkpoint.parallel_write.pipeline_stage");
}

TEST(DsConfig, CheckpointWriterKeysAndDefaultsAreDeepSpeeds) {
  auto c = parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {}}})");
  ASSERT_TRUE(c.checkpoint.writer.has_value());
  const CheckpointWriterConfig& w = *c.checkpoint.writer;
  EXPECT_EQ(w.type, "FAST");
  EXPECT_FALSE(w.decoupled);
  EXPECT_EQ(w.io_buffer_size, 64 << 20);
  EXPECT_TRUE(w.io_buffer_double);
  EXPECT_FALSE(w.show_statistics);
  EXPECT_FALSE(w.data_parallel.has_value());
  EXPECT_EQ(w.io_multiplier, 1);
  EXPECT_TRUE(c.warnings.empty());
  c = parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {"type": "Python",
      "decoupled": true, "io_buffer_size": 12288, "io_buffer_double": false,
      "show_statistics": true}}})");
  EXPECT_EQ(c.checkpoint.writer->type, "PYTHON");
  EXPECT_TRUE(c.checkpoint.writer->decoupled);
  EXPECT_EQ(c.checkpoint.writer->io_buffer_size, 12288);
  EXPECT_TRUE(c.checkpoint.writer->show_statistics);
  // Only the FAST writer stages O_DIRECT writes in the buffer.
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {"type": "mock",
      "io_buffer_size": 1000}}})"));
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "io_buffer_size": 12288, "io_buffer_double": false}}})"));
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "io_buffer_size": 64e6}}})"), ConfigError,
      "checkpoint.writer.io_buffer_size is 64000000; the FAST writer splits it into two O_DIRECT "
      "buffers, so it must be a multiple of 8192");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "io_buffer_size": 0}}})"), ConfigError, "checkpoint.writer.io_buffer_size");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {"type": "gds"}}})"),
                    ConfigError, "checkpoint.writer.type is \"GDS\"; expected one of MOCK, "
                    "PYTHON, FAST");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "data_parallel": "node"}}})"), ConfigError, "checkpoint.writer.data_parallel");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "decoupled": "yes"}}})"), ConfigError, "checkpoint.writer.decoupled");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": {
      "io_buffer_sizes": 8192}}})"), ConfigError, "checkpoint.writer.io_buffer_sizes");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "checkpoint": {"writer": "fast"}})"),
                    ConfigError, "checkpoint.writer");
}

TEST(DsConfig, LegacyAndDeprecatedForms) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": true, "allgather_size": 1000})");
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 1000);
  EXPECT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(parse(R"({"train_batch_size": 8, "zero_optimization": false})").zero_optimization.stage, 0);

  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true}})");
  ASSERT_TRUE(c.zero_optimization.offload_optimizer.has_value());
  EXPECT_EQ(c.zero_optimization.offload_optimizer->device, OffloadDevice::kCpu);

  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 100}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 100);
  EXPECT_TRUE(c.zero_optimization.overlap_comm_enabled());
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization":
      {"stage3_prefetch_bucket_size": 1, "prefetch_bucket_size": 2}})"),
                    ConfigError, "alias 'prefetch_bucket_size' are both set");

  c = parse(R"({"train_batch_size": 8, "bfloat16": {"enabled": false}})");
  EXPECT_FALSE(c.bf16.enabled);
}

// offload_*.device is parsed once into OffloadDevice; the runtime never compares strings.
TEST(DsConfig, OffloadDeviceIsParsedOnceIntoItsEnum) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "NVMe", "nvme_path": "/tmp/swap"},
      "offload_param": {"device": "cpu"}}})");
  EXPECT_EQ(c.zero_optimization.optimizer_offload(), OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.param_offload(), OffloadDevice::kCpu);
  EXPECT_EQ(c.resolved()["zero_optimization"]["offload_optimizer"]["device"], "nvme");
  EXPECT_EQ(c.resolved()["zero_optimization"]["offload_param"]["device"], "cpu");

  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "none"}}})");
  EXPECT_EQ(c.zero_optimization.optimizer_offload(), OffloadDevice::kNone);
  EXPECT_EQ(c.zero_optimization.param_offload(), OffloadDevice::kNone);  // section absent
  EXPECT_STREQ(offload_device_name(OffloadDevice::kNone), "none");

  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "gpu"}}})"), ConfigError,
                    "zero_optimization.offload_optimizer.device is \"gpu\"; expected one of none, "
                    "cpu, nvme");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "disk"}}})"), ConfigError,
                    "zero_optimization.offload_param.device is \"disk\"; expected one of none, "
                    "cpu, nvme");
}

TEST(DsConfig, Fp16AndBf16Together) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                    ConfigError, "bf16 and fp16 modes cannot be simultaneously enabled");
}

TEST(DsConfig, UnimplementedFeaturesAreRefusedByName) {
  auto refuse = [](const std::string& text, const std::string& what) {
    auto c = DeepSpeedConfig::from_string(text, 1);
    EXPECT_THROW_WITH(c.check_supported(), NotSupportedError, what + " is not supported yet");
  };
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2,
      "mics_shard_size": 2}})",
         "zero_optimization.zero_hpz_partition_size together with mics_shard_size");
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2,
      "offload_param": {"device": "cpu"}}})",
         "zero_optimization.zero_hpz_partition_size with offload_param");
  // MiCS: not with offload (DeepSpeed raises on offloaded gradients) or sequence parallelism.
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 2,
      "offload_optimizer": {"device": "cpu"}}})",
         "zero_optimization.mics_shard_size with offload_optimizer or offload_param");
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 2,
      "offload_param": {"device": "cpu"}}})",
         "zero_optimization.mics_shard_size with offload_optimizer or offload_param");
  refuse(R"({"train_batch_size": 8, "sequence_parallel_size": 2,
      "zero_optimization": {"stage": 3, "mics_shard_size": 2}})",
         "zero_optimization.mics_shard_size with sequence_parallel_size > 1");
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "elastic_checkpoint": true}})",
         "zero_optimization.elastic_checkpoint with ZeRO stage 3");
  refuse(R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "bf16"}})",
         "data_types.grad_accum_dtype bf16 with an fp32 model and zero_optimization.stage 0");
  refuse(R"({"train_batch_size": 8, "wandb": {"enabled": true}})", "wandb.enabled");
  refuse(R"({"train_batch_size": 8, "optimizer": {"type": "MuAdam"}})", "optimizer.type \"MuAdam\"");
  refuse(R"({"train_batch_size": 8, "optimizer": {"type": "RMSprop", "params": {"lr": 0.1}}})",
         "optimizer.type \"RMSprop\" (torch.optim)");
  refuse(R"({"train_batch_size": 8, "scheduler": {"type": "StepLR"}})",
         "scheduler.type \"StepLR\" (torch.optim.lr_scheduler)");
  // Implemented now: ZeRO 1/2, fp16, bf16, the monitors and the flops profiler.
  for (const char* ok : {R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                             "mics_shard_size": 2, "mics_hierarchical_params_gather": true}})",
                         R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                             "zero_hpz_partition_size": 2}})",
                         R"({"train_batch_size": 8, "fp16": {"enabled": true}})",
                         R"({"train_batch_size": 8, "bf16": {"enabled": true}})",
                         R"({"train_batch_size": 8, "tensorboard": {"enabled": true}})",
                         R"({"train_batch_size": 8, "flops_profiler": {"enabled": true}})"}) {
    EXPECT_NO_THROW(parse(ok).check_supported()) << ok;
  }
  // Present but disabled is fine.
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "fp16": {"enabled": false},
                           "tensorboard": {"enabled": false}})").check_supported());
}

// 16-bit master weights (Note [Low-precision masters]): DeepSpeed's rules, each a ConfigError
// naming the key; a flag whose section is off warns.
TEST(DsConfig, LowPrecisionMastersFollowDeepSpeedsRules) {
  const std::string adam = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.1}})";
  auto cfg = [&](const std::string& precision, const std::string& zero,
                 const std::string& optimizer) {
    return "{\"train_batch_size\": 8, " + precision + ", \"zero_optimization\": " + zero +
           (optimizer.empty() ? "" : ", " + optimizer) + "}";
  };
  const std::string bf16 = R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true})";
  const std::string fp16 = R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true})";
  const std::string offload = R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  EXPECT_THROW_WITH(parse(cfg(bf16, R"({"stage": 0})", adam)), ConfigError,
                    "bf16.bf16_master_weights_and_grads needs zero_optimization.stage 1, 2 or 3");
  EXPECT_THROW_WITH(parse(cfg(fp16, R"({"stage": 0})", adam)), ConfigError,
                    "fp16.fp16_master_weights_and_grads needs zero_optimization.stage 1, 2 or 3");
  // The moments stay fp32 on CPU Adam: offload, unless bf16_optimizer_states.
  EXPECT_THROW_WITH(parse(cfg(bf16, R"({"stage": 2})", adam)), ConfigError,
                    "needs zero_optimization.offload_optimizer");
  EXPECT_THROW_WITH(parse(cfg(fp16, R"({"stage": 3})", adam)), ConfigError,
                    "needs zero_optimization.offload_optimizer");
  const std::string bf16_states = R"("bf16": {"enabled": true,
      "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true})";
  EXPECT_NO_THROW(parse(cfg(bf16_states, R"({"stage": 2})", R"("optimizer": {"type": "Lamb"})"))
                      .check_supported());
  // Offloaded: DeepSpeed's CPU Adam only.
  EXPECT_THROW_WITH(parse(cfg(bf16, offload, R"("optimizer": {"type": "Lamb"})")), ConfigError,
                    "needs DeepSpeed's CPU Adam (optimizer.type \"Adam\" or \"AdamW\" without "
                    "torch_adam); optimizer.type is \"Lamb\"");
  EXPECT_THROW_WITH(
      parse(cfg(fp16, offload, R"("optimizer": {"type": "Adam", "params": {"torch_adam": true}})")),
      ConfigError, "optimizer.type is \"Adam\" with torch_adam");
  for (const auto& ok : {cfg(bf16, offload, adam), cfg(fp16, offload, adam),
                         cfg(bf16_states, offload, adam), cfg(bf16, offload, "")}) {
    EXPECT_NO_THROW(parse(ok).check_supported()) << ok;
  }
  const auto off = parse(
      R"({"train_batch_size": 8, "bf16": {"bf16_master_weights_and_grads": true}})");
  ASSERT_EQ(off.warnings.size(), 1u);
  EXPECT_NE(off.warnings[0].find("bf16.bf16_master_weights_and_grads has no effect without "
                                 "bf16.enabled"),
            std::string::npos);
}

TEST(DsConfig, EveryTypeMismatchIsAConfigErrorNamingKeyAndType) {
  // Includes the sections read only to know whether a feature is on: they used to be read with
  // nlohmann's value<>(), whose type_error 302 aborted ds_config.
  for (auto [text, message] : {
           std::pair{R"({"compile": {"deepcompile": "true"}})",
                     "compile.deepcompile is \"true\"; expected true or false"},
           std::pair{R"({"tensor_parallel": {"autotp_size": "2"}})",
                     "tensor_parallel.autotp_size is \"2\"; expected an integer"},
           std::pair{R"({"tensor_parallel": {"autotp_size": "auto"}})",
                     "tensor_parallel.autotp_size is \"auto\"; \"auto\" is a placeholder"},
           std::pair{R"({"graph_harvesting": {"enabled": true}})",
                     "graph_harvesting is {\"enabled\":true}; expected true or false"},
           std::pair{R"({"sequence_parallel_size": "2"})",
                     "sequence_parallel_size is \"2\"; expected an integer"},
           std::pair{R"({"sequence_parallel_size": 0})", "sequence_parallel_size is 0"},
           std::pair{R"({"seq_parallel_communication_data_type": "fp8"})",
                     "seq_parallel_communication_data_type is \"fp8\"; supported data types"},
           std::pair{R"({"data_parallel_size": "2"})",
                     "data_parallel_size is \"2\"; expected an integer"},
           std::pair{R"({"amp": {"enabled": 1}})", "amp.enabled is 1; expected true or false"},
           std::pair{R"({"amp": true})", "amp is true; expected an object"},
           std::pair{R"({"curriculum_learning": {"enabled": "false"}})",
                     "curriculum_learning.enabled is \"false\"; expected true or false"},
           std::pair{R"({"sparse_attention": "fixed"})",
                     "sparse_attention is \"fixed\"; expected an object"},
           std::pair{R"({"compression_training": {"sparse_pruning": {"shared_parameters":
                        {"enabled": "yes"}}}})",
                     "compression_training.sparse_pruning.shared_parameters.enabled is \"yes\""},
           std::pair{R"({"compression_training": {"layer_reduction": []}})",
                     "compression_training.layer_reduction is []; expected an object"},
           std::pair{R"({"comet": {"online": "yes"}})",
                     "comet.online is \"yes\"; expected true or false"},
           std::pair{R"({"vocabulary_size": 50257.5})", "vocabulary_size is 50257.5"},
           std::pair{R"({"zero_optimization": {"zenflow": 1}})",
                     "zero_optimization.zenflow is 1; expected an object"},
           std::pair{R"({"zero_optimization": {"reduce_bucket_size": -1}})",
                     "zero_optimization.reduce_bucket_size is -1; expected an integer >= 0"}}) {
    json doc = json::parse(text);
    doc["train_batch_size"] = 8;
    EXPECT_THROW_WITH(DeepSpeedConfig::from_json(doc, 1), ConfigError, message);
  }
}

TEST(DsConfig, FormsDeepSpeedAcceptsAreAccepted) {
  // Older Hugging Face ZeRO-3 configs use 0 sizes; DeepSpeed reduces each gradient on its own.
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                     "reduce_bucket_size": 0, "stage3_prefetch_bucket_size": 0,
                     "stage3_param_persistence_threshold": 0}})");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_numel(), 1);
  EXPECT_EQ(c.resolved()["zero_optimization"]["reduce_bucket_size"], 0);
  EXPECT_NO_THROW(c.check_supported());
  // A compression_training section with every technique disabled is fine.
  c = parse(R"({"train_batch_size": 8, "compression_training": {
      "weight_quantization": {"shared_parameters": {"enabled": false}, "different_groups": {}},
      "activation_quantization": {"shared_parameters": {"enabled": false}},
      "sparse_pruning": {"shared_parameters": {"enabled": false}},
      "row_pruning": {"shared_parameters": {"enabled": false}},
      "head_pruning": {"shared_parameters": {"enabled": false}},
      "channel_pruning": {"shared_parameters": {"enabled": false}},
      "layer_reduction": {"enabled": false}}})");
  EXPECT_NO_THROW(c.check_supported());
  EXPECT_TRUE(c.warnings.empty());
  // Disabled switches of the other unimplemented sections, too.
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "compile": {"deepcompile": false},
      "tensor_parallel": {"autotp_size": 1}, "graph_harvesting": false,
      "sequence_parallel_size": 1, "amp": {"enabled": false, "opt_level": "O1"}})")
                      .check_supported());
  // max_grad_norm is judged by the optimizer (DeepSpeed's engine), not when parsing.
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam",
                           "params": {"max_grad_norm": 1.0}}})"));
}

TEST(DsConfig, ConfigAndEngineRefuseTheSameThings) {
  auto refuse = [](const std::string& text, const std::string& what) {
    auto c = DeepSpeedConfig::from_string(text, 1);
    EXPECT_THROW_WITH(c.check_supported(), NotSupportedError, what);
  };
  // The engine's ZeRO-3 and NVMe swapper refuse these; check_supported() (so ds_config) too.
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
            "stage3_module_granularity_threshold": 100}})",
         "zero_optimization.stage3_module_granularity_threshold 100 is not supported");
  refuse(R"({"train_batch_size": 8, "aio": {"use_gds": true}, "zero_optimization": {"stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})",
         "aio.use_gds (GPUDirect Storage) is not supported");
  refuse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}})",
         "zero_optimization.zenflow (ZenFlow) is not supported yet");
  // compression_training is implemented (compression.h) but for these.
  refuse(R"({"train_batch_size": 8, "compression_training": {"sparse_pruning":
            {"shared_parameters": {"enabled": true, "method": "snip_momentum"}}}})",
         "compression_training.sparse_pruning.shared_parameters.method \"snip_momentum\"");
  refuse(R"({"train_batch_size": 8, "compression_training": {"weight_quantization":
            {"shared_parameters": {"enabled": true, "quantizer_kernel": true},
             "different_groups": {}}}})",
         "compression_training.weight_quantization.shared_parameters.quantizer_kernel");
  refuse(R"({"train_batch_size": 8, "quantize_training": {"enabled": true}})",
         "quantize_training.enabled (the legacy MoQ section; MoQ is "
         "compression_training.weight_quantization");
  // Where the engine does not use them (no stage 3, no NVMe), DeepSpeed ignores them.
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                           "stage3_module_granularity_threshold": 100}})").check_supported());
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 8, "aio": {"use_gds": true}})").check_supported());
}

TEST(DsConfig, MisspeltCompressionTechniqueIsAWarning) {
  auto c = parse(R"({"train_batch_size": 8, "compression_training": {"sparse_pruninng": {}}})");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("compression_training.sparse_pruninng is not a known key; did you "
                               "mean 'sparse_pruning'?"), std::string::npos) << c.warnings[0];
}

TEST(DsConfig, UnknownOptimizerAndSchedulerNames) {
  auto c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adamm"}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError, "\"Adamm\" is not a supported DeepSpeed optimizer");
  c = parse(R"({"train_batch_size": 8, "scheduler": {"type": "Warmup"}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError, "does not recognize LR scheduler \"Warmup\"");
  c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1, "momentum": 0.9}}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError, "optimizer.params.momentum is not a parameter of Adam");
  // Matches DeepSpeed's engine (ValueError when it builds the optimizer from this section).
  c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1}}})");
  EXPECT_THROW_WITH(c.check_supported(), ConfigError,
                    "optimizer.params.max_grad_norm is not supported as an optimizer parameter "
                    "(DeepSpeed raises ValueError for it too); remove it and set the top-level "
                    "\"gradient_clipping\" instead");
}

TEST(DsConfig, ResolvedFillsTriadAndDefaults) {
  auto c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 4);
  json r = c.resolved();
  EXPECT_EQ(r["gradient_accumulation_steps"], 2);
  EXPECT_EQ(r["zero_optimization"]["stage"], 0);
  EXPECT_EQ(r["fp16"]["initial_scale_power"], 16);
  EXPECT_EQ(r["gradient_clipping"], 1.0);
  EXPECT_TRUE(r["steps_per_print"].is_null());
}

}  // namespace
}  // namespace deepspeed

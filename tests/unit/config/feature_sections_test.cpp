// Feature sections (activation checkpointing, flops profiler, aio, pipeline, data types,
// elasticity, progressive layer drop, curriculum learning, torch autocast): defaults, errors and
// refusals.
#include "deepspeed/config.h"

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed {
namespace {

DeepSpeedConfig parse(const std::string& text) { return DeepSpeedConfig::from_string(text, 1); }

TEST(FeatureSections, DefaultsMatchDeepSpeed) {
  auto c = parse(R"({"train_batch_size": 4})");
  EXPECT_FALSE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.pipeline.stages, "auto");
  EXPECT_EQ(c.pipeline.partition, "best");
  EXPECT_EQ(c.elasticity.max_train_batch_size, 2000);
  EXPECT_EQ(c.elasticity.micro_batch_sizes, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_TRUE(c.data_types.grad_accum_dtype.empty());
  json r = c.resolved();
  EXPECT_EQ(r["aio"]["intra_op_parallelism"], 1);
  EXPECT_TRUE(r["flops_profiler"]["output_file"].is_null());
}

TEST(FeatureSections, LegacyAioThreadCountAndDtypeSpellings) {
  auto c = parse(R"({"train_batch_size": 4, "aio": {"thread_count": 4},
                     "data_types": {"grad_accum_dtype": "torch.float32"}})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_EQ(c.data_types.grad_accum_dtype, "fp32");
  EXPECT_NO_THROW(c.check_supported());
  // aio deprecation + "has no effect" (no NVMe offload configured)
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[1].find("aio has no effect: it configures NVMe offload"), std::string::npos)
      << c.warnings[1];
  auto nvme = parse(R"({"train_batch_size": 4, "aio": {"block_size": 4096},
                        "zero_optimization": {"stage": 3, "offload_param":
                          {"device": "nvme", "nvme_path": "/tmp"}}})");
  EXPECT_TRUE(nvme.warnings.empty()) << nvme.warnings.front();
}

TEST(FeatureSections, ErrorsNameTheKey) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "data_types": {"param_dtype": "bf16"}})"),
                    ConfigError, "data_types.param_dtype is bf16 but the precision mode is fp32");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "data_types": {"grad_accum_dtype": "fp8"}})"),
                    ConfigError, "data_types.grad_accum_dtype is \"fp8\"");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "progressive_layer_drop": {"enabled": true, "theta": 0.5}})"),
                    ConfigError, "progressive_layer_drop.gamma is required");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "elasticity": {"enabled": true}})"),
                    ConfigError, "elasticity.max_train_batch_size is missing");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "elasticity": {"enabled": true,
                             "max_train_batch_size": 8, "micro_batch_sizes": [2]}})"),
                    ConfigError, "train_batch_size is set, and so is elasticity.enabled");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "pipeline": {"stages": 0}})"), ConfigError,
                    "pipeline.stages is 0");
}

TEST(FeatureSections, ActivationCheckpointingDefaultsMatchDeepSpeed) {
  const auto a = parse(R"({"train_batch_size": 4})").activation_checkpointing;
  EXPECT_FALSE(a.partition_activations);
  EXPECT_FALSE(a.cpu_checkpointing);
  EXPECT_FALSE(a.contiguous_memory_optimization);
  EXPECT_FALSE(a.number_checkpoints.has_value());
  EXPECT_FALSE(a.synchronize_checkpoint_boundary);
  EXPECT_FALSE(a.profile);
}

TEST(FeatureSections, ActivationCheckpointingIsImplementedAndReadWithoutWarnings) {
  auto c = parse(R"({"train_batch_size": 4, "activation_checkpointing":
                     {"partition_activations": true, "cpu_checkpointing": true,
                      "contiguous_memory_optimization": true, "number_checkpoints": 4,
                      "synchronize_checkpoint_boundary": true, "profile": true}})");
  EXPECT_NO_THROW(c.check_supported());
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  const auto& a = c.activation_checkpointing;
  EXPECT_TRUE(a.partition_activations && a.cpu_checkpointing && a.contiguous_memory_optimization &&
              a.synchronize_checkpoint_boundary && a.profile);
  EXPECT_EQ(a.number_checkpoints, 4);
  EXPECT_EQ(c.resolved()["activation_checkpointing"]["number_checkpoints"], 4);
}

TEST(FeatureSections, ContiguousMemoryOptimizationNeedsPartitionsAndACheckpointCount) {
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "activation_checkpointing":
                             {"contiguous_memory_optimization": true, "number_checkpoints": 2}})"),
                    ConfigError,
                    "activation_checkpointing.contiguous_memory_optimization is true but "
                    "partition_activations is false");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "activation_checkpointing":
                             {"contiguous_memory_optimization": true,
                              "partition_activations": true}})"),
                    ConfigError, "number_checkpoints is not set");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "activation_checkpointing":
                             {"number_checkpoints": 0}})"),
                    ConfigError, "activation_checkpointing.number_checkpoints");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "activation_checkpointing":
                             {"cpu_checkpointing": "yes"}})"),
                    ConfigError, "activation_checkpointing.cpu_checkpointing");
}

TEST(FeatureSections, UnknownActivationCheckpointingKeyWarnsByName) {
  auto c = parse(R"({"train_batch_size": 4, "activation_checkpointing":
                     {"partitioned_activations": true}})");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("activation_checkpointing.partitioned_activations is not a known "
                               "key; did you mean 'partition_activations'?"),
            std::string::npos)
      << c.warnings[0];
}

TEST(FeatureSections, TorchAutocastIsSupportedAlone) {
  auto c = parse(R"({"train_batch_size": 4, "torch_autocast": {"enabled": true,
                     "dtype": "torch.bfloat16",
                     "lower_precision_safe_modules": ["torch.nn.Linear"]}})");
  EXPECT_NO_THROW(c.check_supported());
  EXPECT_EQ(c.torch_autocast.dtype, "bf16");
  EXPECT_EQ(c.torch_autocast.lower_precision_safe_modules,
            std::vector<std::string>{"torch.nn.Linear"});
  for (const char* mode : {"fp16", "bf16"}) {
    auto both = parse(
        std::string(R"({"train_batch_size": 4, "torch_autocast": {"enabled": true}, ")") + mode +
        R"(": {"enabled": true}})");
    EXPECT_THROW_WITH(both.check_supported(), NotSupportedError,
                      std::string("torch_autocast.enabled together with ") + mode + ".enabled");
  }
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "torch_autocast": {"dtype": "float32"}})"),
                    ConfigError, "torch_autocast.dtype");
  EXPECT_THROW_WITH(parse(R"({"train_batch_size": 4, "torch_autocast": {"dtype": "int8"}})"),
                    ConfigError, "torch_autocast.dtype");
}

TEST(FeatureSections, SparseGradientsWithA16BitStage0AreRefused) {
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 4, "sparse_gradients": true})").check_supported());
  EXPECT_NO_THROW(parse(R"({"train_batch_size": 4, "sparse_gradients": true,
                           "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})")
                      .check_supported());
  auto c = parse(R"({"train_batch_size": 4, "sparse_gradients": true, "fp16": {"enabled": true}})");
  EXPECT_THROW_WITH(c.check_supported(), NotSupportedError,
                    "sparse_gradients with fp16 and zero_optimization.stage 0");
}

TEST(FeatureSections, SixteenBitAccumulationOfAnFp32ModelIsRefused) {
  auto c = parse(R"({"train_batch_size": 4, "data_types": {"grad_accum_dtype": "bf16"}})");
  EXPECT_THROW_WITH(c.check_supported(), NotSupportedError, "data_types.grad_accum_dtype bf16");
}

TEST(FeatureSections, ProgressiveLayerDropIsSupported) {
  auto c = parse(R"({"train_batch_size": 4,
                     "progressive_layer_drop": {"enabled": true, "theta": 0.5, "gamma": 0.001}})");
  EXPECT_NO_THROW(c.check_supported());
  EXPECT_TRUE(c.progressive_layer_drop.enabled);
  EXPECT_DOUBLE_EQ(c.progressive_layer_drop.theta, 0.5);
}

TEST(FeatureSections, CurriculumLearningReadsEachScheduleType) {
  auto linear = parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true,
      "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 1024,
      "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 15000, "difficulty_step": 8}}})");
  EXPECT_NO_THROW(linear.check_supported());
  const auto& cl = linear.curriculum_learning;
  EXPECT_TRUE(cl.enabled);
  EXPECT_EQ(cl.curriculum_type, "seqlen");
  EXPECT_EQ(cl.min_difficulty, 8);
  EXPECT_EQ(cl.max_difficulty, 1024);
  EXPECT_EQ(cl.total_curriculum_step, 15000);
  EXPECT_EQ(cl.difficulty_step, 8);
  EXPECT_TRUE(linear.warnings.empty());
  EXPECT_EQ(linear.resolved()["curriculum_learning"]["schedule_config"]["total_curriculum_step"],
            15000);

  auto root = parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true,
      "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
      "schedule_type": "fixed_root", "schedule_config":
        {"total_curriculum_step": 100, "difficulty_step": 4, "root_degree": 2}}})");
  EXPECT_DOUBLE_EQ(root.curriculum_learning.root_degree, 2.0);
  // DeepSpeed's Tensor Core warning for a step that is not a multiple of 8.
  ASSERT_EQ(root.warnings.size(), 1u);
  EXPECT_NE(root.warnings[0].find("curriculum_learning.schedule_config.difficulty_step is 4"),
            std::string::npos) << root.warnings[0];

  auto discrete = parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true,
      "curriculum_type": "vocab", "min_difficulty": 1, "max_difficulty": 3,
      "schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]}}})");
  EXPECT_EQ(discrete.curriculum_learning.difficulty, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(discrete.curriculum_learning.max_step, (std::vector<int64_t>{5, 10}));

  auto custom = parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true,
      "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
      "schedule_type": "custom"}})");
  EXPECT_EQ(custom.curriculum_learning.schedule_type, "custom");

  // Matches DeepSpeed: a disabled section is not read further.
  auto off = parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": false,
      "schedule_type": "nonsense"}})");
  EXPECT_FALSE(off.curriculum_learning.enabled);
  EXPECT_TRUE(off.warnings.empty());
}

TEST(FeatureSections, CurriculumLearningErrorsNameTheKey) {
  auto section = [](const std::string& body) {
    return parse(R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true, )" + body +
                 "}}");
  };
  const std::string head =
      R"("curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64, )";
  EXPECT_THROW_WITH(section(R"("curriculum_type": "seqlen", "max_difficulty": 64,
                               "schedule_type": "custom")"),
                    ConfigError, "curriculum_learning.min_difficulty is required");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_cubic", "schedule_config": {})"),
                    ConfigError, "curriculum_learning.schedule_type is \"fixed_cubic\"");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_linear")"), ConfigError,
                    "curriculum_learning.schedule_config is required");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_root", "schedule_config":
                               {"total_curriculum_step": 10, "difficulty_step": 8})"),
                    ConfigError,
                    "curriculum_learning.schedule_config.root_degree is required with "
                    "schedule_type \"fixed_root\"");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_linear", "schedule_config":
                               {"total_curriculum_step": 0, "difficulty_step": 8})"),
                    ConfigError, "curriculum_learning.schedule_config.total_curriculum_step is 0");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_discrete", "schedule_config":
                               {"difficulty": [8, 16], "max_step": [5, 10]})"),
                    ConfigError,
                    "curriculum_learning.schedule_config.difficulty has 2 entries; expected one "
                    "more than max_step's 2");
  EXPECT_THROW_WITH(section(head + R"("schedule_type": "fixed_discrete", "schedule_config":
                               {"difficulty": [8, "16"], "max_step": [5]})"),
                    ConfigError, "curriculum_learning.schedule_config.difficulty is \"16\"");
}

TEST(FeatureSections, UnknownKeysInLegacySectionsWarn) {
  auto c = parse(R"({"train_batch_size": 4, "flops_profiler": {"profile_stp": 3}})");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("flops_profiler.profile_stp is not a known key; did you mean "
                               "'profile_step'?"), std::string::npos) << c.warnings[0];
}

}  // namespace
}  // namespace deepspeed

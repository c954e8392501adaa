// The tensor_parallel section (see tensor_parallel_section.h).
#include "config/tensor_parallel_section.h"

namespace deepspeed::config_detail {

TensorParallelSection read_tensor_parallel_section(ConfigReader& top,
                                                   std::vector<std::string>* unimplemented) {
  TensorParallelSection s;
  ConfigReader r = top.section("tensor_parallel", Strictness::kStrict);
  if (!r.present()) return s;
  s.autotp_size = r.get_int("autotp_size", 0, 0);
  s.tp_overlap_comm = r.get_bool("tp_overlap_comm", false);
  s.keep_module_on_host = r.get_bool("keep_module_on_host", false);
  s.dtype = r.get_opt_string("dtype").value_or("");
  // DeepSpeed's TPConfig, under "tensor_parallel" or its alias "tp".
  const bool nested = r.has("tensor_parallel"), alias = r.has("tp");
  if (nested && alias) r.fail("tp", "and tensor_parallel.tensor_parallel are the same section; give one");
  {
    ConfigReader tp = r.section(alias ? "tp" : "tensor_parallel", Strictness::kStrict);
    s.tp_size = tp.get_int("tp_size", 1, 1);
    s.tp_grain_size = tp.get_int("tp_grain_size", 1, 1);
    if (tp.get_raw("mpu")) unimplemented->emplace_back("tensor_parallel.tensor_parallel.mpu");
    if (tp.get_raw("tp_group")) unimplemented->emplace_back("tensor_parallel.tensor_parallel.tp_group");
    tp.finish();
  }
  if (r.get_bool("replace_with_kernel_inject", false)) {
    unimplemented->emplace_back("tensor_parallel.replace_with_kernel_inject");
  }
  if (r.get_raw("injection_policy_tuple")) {
    unimplemented->emplace_back("tensor_parallel.injection_policy_tuple");
  }
  if (r.get_raw("partition_config")) unimplemented->emplace_back("tensor_parallel.partition_config");
  if (r.get_raw("preset_model")) unimplemented->emplace_back("tensor_parallel.preset_model");
  if (s.tp_overlap_comm) unimplemented->emplace_back("tensor_parallel.tp_overlap_comm");
  // DeepSpeed 0.19.8's vocabulary-parallel LM head. null follows a Hugging Face tp_plan that
  // asks for it (there is none here), false keeps the head replicated: both are what AutoTP
  // does here. true shards lm_head's rows and trains with a vocabulary-parallel loss, which a
  // C++ model computes itself (linear_cross_entropy with tp_group, docs/cross_entropy.md).
  if (r.get_bool("vocab_parallel_lm_head", false)) {
    unimplemented->emplace_back("tensor_parallel.vocab_parallel_lm_head (AutoTP keeps the LM "
                                "head replicated; linear_cross_entropy takes a vocabulary-"
                                "parallel head's loss)");
  }
  const std::string ce_backend = r.get_string("vocab_parallel_ce_backend", "torch");
  if (ce_backend == "liger") {
    unimplemented->emplace_back("tensor_parallel.vocab_parallel_ce_backend \"liger\"");
  } else if (ce_backend != "torch") {
    r.fail("vocab_parallel_ce_backend",
           "must be \"torch\" or \"liger\", got \"" + ce_backend + "\"");
  }
  // DeepSpeed's training path splits evenly and leaves tp_grain_size to inference ("not
  // activated in training yet"); a grain other than 1 would promise uneven shards.
  if (s.tp_grain_size != 1) {
    unimplemented->emplace_back("tensor_parallel.tensor_parallel.tp_grain_size != 1 (uneven shards)");
  }
  r.finish();
  return s;
}

TensorParallelSection tensor_parallel_section(const DeepSpeedConfig& c) {
  std::vector<std::string> warnings, unimplemented;
  ConfigReader top(&c.raw, "", c.source, Strictness::kWarnUnknown, &warnings);
  return read_tensor_parallel_section(top, &unimplemented);
}

}  // namespace deepspeed::config_detail

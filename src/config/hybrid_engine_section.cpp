// The `hybrid_engine` section: a strict section in DeepSpeed (a pydantic model), so an unknown
// key is an error. What needs DeepSpeed's inference kernels is refused (inference tensor
// parallelism, CUDA graphs) or, where it only sizes or frees their workspace, warned about.
#include "config/feature_sections.h"

namespace deepspeed::config_detail {

void parse_hybrid_engine(ConfigReader& top, DeepSpeedConfig& c) {
  ConfigReader r = top.section("hybrid_engine", Strictness::kStrict);
  HybridEngineConfig& h = c.hybrid_engine;
  h.enabled = r.get_bool("enabled", false);
  h.max_out_tokens = r.get_int("max_out_tokens", 512, 1);
  h.inference_tp_size = r.get_int("inference_tp_size", 1, 1);
  h.release_inference_cache = r.get_bool("release_inference_cache", false);
  h.pin_parameters = r.get_bool("pin_parameters", true);
  h.tp_gather_partition_size = r.get_int("tp_gather_partition_size", 8, 1);
  h.enable_cuda_graph = r.get_bool("enable_cuda_graph", false);
  r.finish();
  if (!h.enabled) return;
  if (h.inference_tp_size > 1) {
    c.unimplemented_requests.push_back("hybrid_engine.inference_tp_size " +
                                       std::to_string(h.inference_tp_size));
  }
  if (h.enable_cuda_graph) {
    c.unimplemented_requests.emplace_back("hybrid_engine.enable_cuda_graph");
  }
  for (const char* key : {"release_inference_cache", "max_out_tokens"}) {
    if (r.has(key)) {
      c.warnings.push_back(r.where(key) + " has no effect: this build has no inference kernels, "
                           "whose workspace it sizes or frees");
    }
  }
}

void resolve_hybrid_engine(const DeepSpeedConfig& c, json& j) {
  const HybridEngineConfig& h = c.hybrid_engine;
  j["hybrid_engine"] = {{"enabled", h.enabled},
                        {"max_out_tokens", h.max_out_tokens},
                        {"inference_tp_size", h.inference_tp_size},
                        {"release_inference_cache", h.release_inference_cache},
                        {"pin_parameters", h.pin_parameters},
                        {"tp_gather_partition_size", h.tp_gather_partition_size},
                        {"enable_cuda_graph", h.enable_cuda_graph}};
}

}  // namespace deepspeed::config_detail

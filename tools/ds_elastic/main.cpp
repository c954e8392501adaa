// ds_elastic: DeepSpeed's `ds_elastic` — the batch size and data-parallel sizes an elastic
// config allows, for a resource scheduler (or a person) to pick a GPU count with.
//   ds_elastic -c CONFIG.json [-w WORLD_SIZE]
// Prints the elasticity section and the results as DeepSpeed's tool lays them out; with a world
// size, also the micro-batch that size trains with. Exit 1 with the error on stderr when the
// config or the world size does not work.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "config/config_source.h"
#include "deepspeed/elasticity.h"

namespace {

const std::string kRule(42, '-');

void heading(const std::string& title) {
  std::cout << kRule << "\n" << title << "\n" << kRule << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Compute the batch size and GPU counts of a DeepSpeed elastic config"};
  std::string path;
  int64_t world_size = 0;
  app.add_option("-c,--config", path, "DeepSpeed config json")->required();
  app.add_option("-w,--world-size", world_size, "Intended/current world size")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  namespace el = deepspeed::elasticity;
  try {
    const auto loaded = deepspeed::config_detail::load_config_text(path);
    if (!loaded.doc.is_object() || !loaded.doc.contains("elasticity")) {
      throw el::ElasticityError(loaded.source +
                                ": 'elasticity' is missing from the config; add it for an "
                                "elastic training job");
    }
    const auto& section = loaded.doc["elasticity"];
    const auto config = el::read_elasticity_config(section, loaded.source);
    heading("Elasticity config:");
    std::cout << section.dump(4) << "\n";
    const auto result = el::compute_elastic_config(config, world_size, loaded.source);
    heading(world_size > 0 ? "Calculated results for world size " + std::to_string(world_size) + ":"
                           : std::string("Calculated results:"));
    std::cout << "final_batch_size .... " << result.final_batch_size << "\n"
              << "valid_gpus .......... " << el::python_list(result.valid_gpus) << "\n";
    if (world_size > 0) std::cout << "micro_batch_size .... " << *result.micro_batch_size << "\n";
  } catch (const deepspeed::Error& e) {
    std::cerr << "ds_elastic: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

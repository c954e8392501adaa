// ds_to_universal: a checkpoint tag folder written by the engine (ZeRO 0-2 with any tensor- and
// data-parallel size, ZeRO-3 with any data-parallel size) as a universal checkpoint, like
// DeepSpeed's ds_to_universal.py:
//   ds_to_universal --input_folder DIR/TAG --output_folder OUT
// writes OUT/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt (full tensors, tensor-parallel
// pieces merged), OUT/zero/optimizer_state.pt, copies of the mp_rank_XX_model_states.pt files,
// and latest_universal (OUT's name) beside OUT. Load it with "checkpoint": {"load_universal":
// true}. Exit 0 on success; non-zero with the error on stderr.
#include <iostream>

#include <CLI/CLI.hpp>

#include "deepspeed/universal_checkpoint.h"

int main(int argc, char** argv) {
  CLI::App app{"Convert a DeepSpeed checkpoint into a universal checkpoint"};
  std::string input, output;
  app.add_option("--input_folder", input, "the checkpoint's tag folder (<dir>/<tag>)")
      ->required();
  app.add_option("--output_folder", output, "the universal checkpoint folder to write")
      ->required();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto r = deepspeed::checkpoint::ds_to_universal(input, output);
    std::cout << "Converted " << r.parameters << " parameters (tensor-parallel degree "
              << r.tp_degree << ", pipeline stages " << r.pp_degree << ", data-parallel degree "
              << r.dp_degree << ") into " << output << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ds_to_universal: error: " << e.what() << "\n";
    return 1;
  }
}

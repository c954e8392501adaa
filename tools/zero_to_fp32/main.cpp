// zero_to_fp32: a ZeRO checkpoint (ours or Python DeepSpeed's) as one fp32 state dict that
// needs neither DeepSpeed nor the training world size, like DeepSpeed's zero_to_fp32.py.
//   zero_to_fp32 CHECKPOINT_DIR OUTPUT [--tag TAG] [--safetensors] [--exclude_frozen_parameters]
// OUTPUT is the file to write, or an existing directory (then pytorch_model.bin, or
// model.safetensors with --safetensors, inside it, as DeepSpeed names them); it may not be a
// file the tool reads (`latest`, anything in the tag folder).
// Exit 0 on success; non-zero with the error on stderr.
#include <sys/stat.h>

#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "deepspeed/checkpoint.h"
#include "deepspeed/errors.h"

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string output_file(const std::string& output, bool safetensors) {
  if (!is_directory(output) && output.back() != '/') return output;
  const std::string dir = output.back() == '/' ? output : output + "/";
  return dir + (safetensors ? "model.safetensors" : "pytorch_model.bin");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Consolidate a DeepSpeed ZeRO checkpoint into a single fp32 state dict"};
  std::string checkpoint_dir, output;
  std::string tag;
  bool safetensors = false, exclude_frozen = false, debug = false;
  std::string max_shard_size;
  app.add_option("checkpoint_dir", checkpoint_dir,
                 "the checkpoint directory (the one holding 'latest' and the tag folders)")
      ->required();
  app.add_option("output", output,
                 "output file, or an existing directory for pytorch_model.bin / model.safetensors")
      ->required();
  app.add_option("-t,--tag", tag, "checkpoint tag (default: the content of CHECKPOINT_DIR/latest)");
  app.add_flag("--safetensors,--safe_serialization", safetensors,
               "write the safetensors format instead of torch.save's");
  app.add_flag("--exclude_frozen_parameters", exclude_frozen, "leave out frozen parameters");
  app.add_flag("-d,--debug", debug, "list every tensor written");
  app.add_option("--max_shard_size", max_shard_size, "not supported: output is one file");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!max_shard_size.empty()) {
      throw deepspeed::NotSupportedError(
          "--max_shard_size: sharded output is not implemented; omit it to write one file");
    }
    const std::string path = output_file(output, safetensors);
    const auto tag_or_latest = tag.empty() ? std::nullopt : std::optional<std::string>(tag);
    deepspeed::checkpoint::check_output_outside_checkpoint(path, checkpoint_dir, tag_or_latest);
    deepspeed::checkpoint::ConsolidateOptions options;
    options.exclude_frozen_parameters = exclude_frozen;
    const auto state =
        deepspeed::checkpoint::consolidate_zero_checkpoint(checkpoint_dir, tag_or_latest, options);
    if (safetensors) {
      deepspeed::checkpoint::save_safetensors(state, path);
    } else {
      deepspeed::checkpoint::save(deepspeed::checkpoint::ivalue_from_tensors(state), path);
    }
    int64_t elements = 0;
    for (const auto& item : state) {
      elements += item.value().numel();
      if (debug) std::cout << item.key() << " " << item.value().sizes() << " "
                           << item.value().scalar_type() << "\n";
    }
    std::cout << "Saved " << state.size() << " tensors (" << elements << " elements) to " << path
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zero_to_fp32: error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "zero_to_fp32: error: unknown exception (a bug in deepspeed-cpp)\n";
    return 1;
  }
}

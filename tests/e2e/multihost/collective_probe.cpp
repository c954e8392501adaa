// collective_probe: the rank program of the multi-host tests. Joins the job through
// deepspeed::comm exactly as a training program does (init_distributed from the launcher's
// environment: RANK..., or OMPI_*/SLURM_* under mpirun/srun), then
//   - prints where it runs (its network namespace, i.e. which "host") and the launcher variables;
//   - checks an all_reduce of an awkward size (4097) against the closed form;
//   - runs a few steps of data-parallel least squares (gradients averaged with all_reduce) and
//     prints the final weights as hex floats, so a test can compare runs bit for bit.
// Every line carries "rank=R" so it reads the same under any launcher. Exit 0 when the checks
// pass, 1 otherwise. Flags: --steps=N (default 5); --local_rank=N is accepted and ignored.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <torch/torch.h>

#include "deepspeed/comm.h"

namespace {

namespace comm = deepspeed::comm;

std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

std::string net_namespace() {
  char buffer[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "?";
}

// Rank r's shard of a fixed regression problem at step s (identical wherever it runs).
std::pair<torch::Tensor, torch::Tensor> shard(int rank, int step) {
  auto g = torch::arange(0, 16, torch::kDouble) + 16.0 * (rank + 3 * step);
  auto x = torch::stack({torch::sin(g), torch::cos(g * 0.5), torch::sin(g * 0.25), torch::ones_like(g)}, 1);
  auto y = torch::sin(g * 0.1) + 0.5;
  return {x.to(torch::kFloat), y.to(torch::kFloat)};
}

std::string hex_floats(const torch::Tensor& t) {
  std::string out;
  auto c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%s%a", i ? "," : "", c.data_ptr<float>()[i]);
    out += buffer;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines through the launcher's pipes as they come
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) steps = std::atoi(argv[i] + 8);
  }
  torch::set_num_threads(1);
  comm::init_distributed();
  const int rank = comm::get_rank();
  const int world = comm::get_world_size();
  const std::string tag = "rank=" + std::to_string(rank) + " ";
  std::printf("%swhere world=%d local_rank=%d local_world=%d netns=%s\n", tag.c_str(), world,
              comm::get_local_rank(), comm::get_local_world_size(), net_namespace().c_str());
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CROSS_RANK", "CROSS_SIZE",
                           "MASTER_ADDR", "MASTER_PORT", "NCCL_MH_TEST", "DS_MH_FROM_FILE"}) {
    std::printf("%senv %s=%s\n", tag.c_str(), name, env_or(name).c_str());
  }

  bool ok = true;
  auto t = torch::arange(0, 4097, torch::kFloat) * static_cast<float>(rank + 1);
  comm::all_reduce(t);
  auto expected = torch::arange(0, 4097, torch::kFloat) * static_cast<float>(world * (world + 1) / 2);
  const bool reduce_ok = torch::equal(t, expected);
  ok = ok && reduce_ok;
  std::printf("%sall_reduce %s\n", tag.c_str(), reduce_ok ? "ok" : "MISMATCH");

  auto w = torch::zeros({4}, torch::kFloat);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = shard(rank, step);
    auto grad = torch::matmul(x.t(), torch::matmul(x, w) - y) / static_cast<float>(x.size(0));
    comm::all_reduce(grad);
    w -= 0.1f * grad / static_cast<float>(world);
  }
  std::printf("%sresult steps=%d w=%s\n", tag.c_str(), steps, hex_floats(w).c_str());
  comm::destroy_process_group();
  return ok ? 0 : 1;
}

// MonitorMaster: which monitors exist (rank 0 only) and the fan-out of events to them.
#include "deepspeed/comm.h"
#include "deepspeed/monitor.h"
#include "util/check.h"

namespace deepspeed::monitor {

MonitorMaster::MonitorMaster(const DeepSpeedConfig& config, int rank) {
  DS_CHECK(!config.wandb.enabled, NotSupportedError, config.source,
           ": wandb.enabled is not supported (Weights & Biases needs its Python client); use "
           "tensorboard or csv_monitor");
  DS_CHECK(!config.comet_enabled, NotSupportedError, config.source,
           ": comet.enabled is not supported (Comet needs its Python client); use tensorboard or "
           "csv_monitor");
  enabled_ = config.tensorboard.enabled || config.csv_monitor.enabled;
  if (rank < 0) rank = comm::is_initialized() ? comm::get_rank() : 0;
  if (rank != 0) return;
  if (config.tensorboard.enabled) {
    auto tb = std::make_unique<TensorBoardMonitor>(config.tensorboard);
    tensorboard_ = tb.get();
    monitors_.push_back(std::move(tb));
  }
  if (config.csv_monitor.enabled) {
    auto csv = std::make_unique<CsvMonitor>(config.csv_monitor);
    csv_ = csv.get();
    monitors_.push_back(std::move(csv));
  }
}

void MonitorMaster::write_events(const std::vector<Event>& events) {
  for (auto& m : monitors_) m->write_events(events);
}

}  // namespace deepspeed::monitor

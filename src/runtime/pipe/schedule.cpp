// The pipeline's instruction streams: DeepSpeed's TrainSchedule (synchronous 1F1B) and
// InferenceSchedule, step for step, so that a stage of this engine and a stage of DeepSpeed's
// issue the same sends and receives in the same order. Pure arithmetic.
#include "deepspeed/pipe.h"

#include "util/check.h"

namespace deepspeed::pipe {
namespace {

using Kind = Instruction::Kind;

bool is_even(int x) { return x % 2 == 0; }

struct Bounds {
  int micro_batches, stages, stage_id;
  bool valid_micro_batch(int id) const { return id >= 0 && id < micro_batches; }
  bool valid_stage(int id) const { return id >= 0 && id < stages; }
};

void check_args(int micro_batches, int stages, int stage_id) {
  DS_CHECK(micro_batches >= 1 && stages >= 1 && stage_id >= 0 && stage_id < stages, UsageError,
           "pipeline schedule: micro_batches ", micro_batches, ", stages ", stages, ", stage_id ",
           stage_id, "; expected micro_batches >= 1 and 0 <= stage_id < stages");
}

// DeepSpeed's TrainSchedule._step_to_micro_batch: even stages run forwards on even steps,
// odd stages on odd steps; the other steps are backwards.
std::pair<int, bool> step_to_micro_batch(int step_id, int stages, int stage_id) {
  if (is_even(step_id) && is_even(stage_id)) return {step_id / 2 - stage_id / 2, true};
  if (!is_even(step_id) && !is_even(stage_id)) return {(step_id - 1) / 2 - stage_id / 2, true};
  if (is_even(step_id) && !is_even(stage_id)) {
    return {step_id / 2 - stages + (stage_id + 1) / 2, false};
  }
  return {(step_id - 1) / 2 - stages + 1 + stage_id / 2, false};
}

}  // namespace

std::string Instruction::str() const {
  const char* name = "?";
  switch (kind) {
    case Kind::kLoadMicroBatch: name = "LoadMicroBatch"; break;
    case Kind::kForwardPass: name = "ForwardPass"; break;
    case Kind::kBackwardPass: name = "BackwardPass"; break;
    case Kind::kSendActivation: name = "SendActivation"; break;
    case Kind::kRecvActivation: name = "RecvActivation"; break;
    case Kind::kSendGrad: name = "SendGrad"; break;
    case Kind::kRecvGrad: name = "RecvGrad"; break;
    case Kind::kReduceTiedGrads: name = "ReduceTiedGrads"; break;
    case Kind::kReduceGrads: name = "ReduceGrads"; break;
    case Kind::kOptimizerStep: name = "OptimizerStep"; break;
  }
  if (buffer_id < 0) return std::string(name) + "()";
  return std::string(name) + "(buffer_id=" + std::to_string(buffer_id) + ")";
}

int train_schedule_num_buffers(int micro_batches, int stages, int stage_id) {
  return std::max(2, std::min(stages - stage_id, micro_batches));
}

ScheduleSteps train_schedule(int micro_batches, int stages, int stage_id) {
  check_args(micro_batches, stages, stage_id);
  const Bounds b{micro_batches, stages, stage_id};
  const int buffers = train_schedule_num_buffers(micro_batches, stages, stage_id);
  const int prev_stage = stage_id - 1;
  const int next_stage = stage_id + 1;
  const int total_steps = 2 * (micro_batches + stages - 1);
  ScheduleSteps steps;
  int prev_micro_batch = -1;
  int prev_buffer = -1;
  int curr_buffer = -1;
  for (int step_id = 0; step_id < total_steps; ++step_id) {
    auto [micro_batch, is_forward] = step_to_micro_batch(step_id, stages, stage_id);
    // Matches DeepSpeed: a buffer index is only recomputed for a valid micro-batch.
    if (b.valid_micro_batch(prev_micro_batch)) prev_buffer = prev_micro_batch % buffers;
    if (b.valid_micro_batch(micro_batch)) curr_buffer = micro_batch % buffers;
    std::vector<Instruction> cmds;
    if (is_forward) {
      if (b.valid_micro_batch(prev_micro_batch) && b.valid_stage(prev_stage)) {
        cmds.push_back({Kind::kSendGrad, prev_buffer});
      }
      if (b.valid_micro_batch(micro_batch) && b.valid_stage(prev_stage)) {
        cmds.push_back({Kind::kRecvActivation, curr_buffer});
      }
    } else {
      if (b.valid_micro_batch(micro_batch) && b.valid_stage(next_stage)) {
        cmds.push_back({Kind::kRecvGrad, curr_buffer});
      }
      if (b.valid_micro_batch(prev_micro_batch) && b.valid_stage(next_stage)) {
        cmds.push_back({Kind::kSendActivation, prev_buffer});
      }
    }
    if ((stage_id == 0 || stage_id == stages - 1) && is_forward &&
        b.valid_micro_batch(micro_batch)) {
      cmds.push_back({Kind::kLoadMicroBatch, curr_buffer});
    }
    if (b.valid_micro_batch(micro_batch)) {
      cmds.push_back({is_forward ? Kind::kForwardPass : Kind::kBackwardPass, curr_buffer});
    }
    if (step_id == total_steps - 1) {
      cmds.push_back({Kind::kReduceTiedGrads, -1});
      cmds.push_back({Kind::kReduceGrads, -1});
      cmds.push_back({Kind::kOptimizerStep, -1});
    }
    prev_micro_batch = micro_batch;
    steps.push_back(std::move(cmds));
  }
  return steps;
}

ScheduleSteps inference_schedule(int micro_batches, int stages, int stage_id) {
  check_args(micro_batches, stages, stage_id);
  const Bounds b{micro_batches, stages, stage_id};
  const int total_steps = micro_batches + stages - 1;
  ScheduleSteps steps;
  for (int step_id = 0; step_id < total_steps; ++step_id) {
    std::vector<Instruction> cmds;
    const int micro_batch = step_id - stage_id;
    // Two buffers alternate between receiving and sending; even and odd stages are out of
    // phase so that a send always meets a receive.
    const int recv_buf = is_even(stage_id) ? step_id % 2 : (step_id + 1) % 2;
    const int send_buf = is_even(stage_id) ? (step_id + 1) % 2 : step_id % 2;
    if ((stage_id == 0 || stage_id == stages - 1) && b.valid_micro_batch(micro_batch)) {
      cmds.push_back({Kind::kLoadMicroBatch, recv_buf});
    }
    const bool send = b.valid_stage(stage_id + 1) && b.valid_micro_batch(micro_batch - 1);
    const bool recv = b.valid_stage(stage_id - 1) && b.valid_micro_batch(micro_batch);
    if (is_even(stage_id)) {
      if (send) cmds.push_back({Kind::kSendActivation, send_buf});
      if (recv) cmds.push_back({Kind::kRecvActivation, recv_buf});
    } else {
      if (recv) cmds.push_back({Kind::kRecvActivation, recv_buf});
      if (send) cmds.push_back({Kind::kSendActivation, send_buf});
    }
    if (b.valid_micro_batch(micro_batch)) cmds.push_back({Kind::kForwardPass, recv_buf});
    steps.push_back(std::move(cmds));
  }
  return steps;
}

}  // namespace deepspeed::pipe

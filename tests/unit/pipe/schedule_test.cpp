// The pipeline instruction streams against DeepSpeed's: for P=2/m=4, P=4/m=4 and P=3/m=2,
// every stage's TrainSchedule and InferenceSchedule, step for step, and the buffer counts.
// The expected strings were printed by DeepSpeed's deepspeed/runtime/pipe/schedule.py
// (deepspeedai/DeepSpeed edaa7221, Aug 2026) with tests/golden/pipe_schedule_golden.py.
#include "deepspeed/pipe.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

namespace deepspeed::pipe {
namespace {

struct Golden {
  const char* kind;
  int stages, micro_batches, stage_id, buffers;
  const char* steps;  // steps joined by " | ", instructions in a step by " "
};

const Golden kGolden[] = {
  {"train", 2, 4, 0, 2,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | RecvGrad(buffer_id=1) SendActivation(buffer_id=0) BackwardPass(buffer_id=1) | LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0) |  | RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 2, 4, 1, 2,
   " | RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"inference", 2, 4, 0, 2,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | LoadMicroBatch(buffer_id=0) SendActivation(buffer_id=1) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1)"},
  {"inference", 2, 4, 1, 2,
   " | LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)"},
  {"train", 4, 4, 0, 4,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) | LoadMicroBatch(buffer_id=2) ForwardPass(buffer_id=2) | SendActivation(buffer_id=2) | LoadMicroBatch(buffer_id=3) ForwardPass(buffer_id=3) | RecvGrad(buffer_id=0) SendActivation(buffer_id=3) BackwardPass(buffer_id=0) |  | RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) |  | RecvGrad(buffer_id=2) BackwardPass(buffer_id=2) |  | RecvGrad(buffer_id=3) BackwardPass(buffer_id=3) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 4, 4, 1, 3,
   " | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) | RecvActivation(buffer_id=2) ForwardPass(buffer_id=2) | RecvGrad(buffer_id=0) SendActivation(buffer_id=2) BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | RecvGrad(buffer_id=1) SendActivation(buffer_id=0) BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) | RecvGrad(buffer_id=2) BackwardPass(buffer_id=2) | SendGrad(buffer_id=2) | RecvGrad(buffer_id=0) BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 4, 4, 2, 2,
   " |  | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | RecvGrad(buffer_id=1) SendActivation(buffer_id=0) BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) | RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) | ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 4, 4, 3, 2,
   " |  |  | RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) |  | ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"inference", 4, 4, 0, 2,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | LoadMicroBatch(buffer_id=0) SendActivation(buffer_id=1) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) |  | "},
  {"inference", 4, 4, 1, 2,
   " | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | RecvActivation(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | RecvActivation(buffer_id=0) SendActivation(buffer_id=1) ForwardPass(buffer_id=0) | RecvActivation(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) | "},
  {"inference", 4, 4, 2, 2,
   " |  | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1)"},
  {"inference", 4, 4, 3, 2,
   " |  |  | LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)"},
  {"train", 3, 2, 0, 2,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) |  | RecvGrad(buffer_id=0) BackwardPass(buffer_id=0) |  | RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 3, 2, 1, 2,
   " | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | SendActivation(buffer_id=0) | RecvActivation(buffer_id=1) ForwardPass(buffer_id=1) | RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) | RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"train", 3, 2, 2, 2,
   " |  | RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | BackwardPass(buffer_id=0) | SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1) | BackwardPass(buffer_id=1) | SendGrad(buffer_id=1) | ReduceTiedGrads() ReduceGrads() OptimizerStep()"},
  {"inference", 3, 2, 0, 2,
   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1) | "},
  {"inference", 3, 2, 1, 2,
   " | RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | RecvActivation(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1) | SendActivation(buffer_id=1)"},
  {"inference", 3, 2, 2, 2,
   " |  | LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0) | LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)"},
};

std::string render(const ScheduleSteps& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i > 0) out += " | ";
    for (size_t j = 0; j < steps[i].size(); ++j) {
      if (j > 0) out += " ";
      out += steps[i][j].str();
    }
  }
  return out;
}

TEST(PipeSchedule, TrainAndInferenceStreamsMatchDeepSpeedStepForStep) {
  int checked = 0;
  for (const auto& g : kGolden) {
    const bool train = std::string(g.kind) == "train";
    const ScheduleSteps steps = train ? train_schedule(g.micro_batches, g.stages, g.stage_id)
                                      : inference_schedule(g.micro_batches, g.stages, g.stage_id);
    EXPECT_EQ(render(steps), g.steps) << g.kind << " P=" << g.stages << " m=" << g.micro_batches
                                      << " stage " << g.stage_id;
    if (train) {
      EXPECT_EQ(train_schedule_num_buffers(g.micro_batches, g.stages, g.stage_id), g.buffers);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 * (2 + 4 + 3));
}

// Each micro-batch is forwarded and backwarded exactly once per stage, forward first, and the
// number of in-flight forwards never exceeds the stage's buffers (what the engine relies on).
TEST(PipeSchedule, EveryMicroBatchRunsForwardThenBackwardWithinTheBuffers) {
  for (int stages : {1, 2, 3, 4}) {
    for (int m : {1, 2, 5, 8}) {
      for (int s = 0; s < stages; ++s) {
        int forwards = 0, backwards = 0, in_flight = 0, max_in_flight = 0;
        for (const auto& step : train_schedule(m, stages, s)) {
          for (const auto& ins : step) {
            if (ins.kind == Instruction::Kind::kForwardPass) {
              ++forwards;
              max_in_flight = std::max(max_in_flight, ++in_flight);
            }
            if (ins.kind == Instruction::Kind::kBackwardPass) {
              ++backwards;
              --in_flight;
              EXPECT_GE(in_flight, 0);
            }
          }
        }
        EXPECT_EQ(forwards, m);
        EXPECT_EQ(backwards, m);
        EXPECT_LE(max_in_flight, train_schedule_num_buffers(m, stages, s))
            << "P=" << stages << " m=" << m << " stage " << s;
      }
    }
  }
}

TEST(PipeSchedule, RejectsAStageOutsideThePipeline) {
  EXPECT_THROW(train_schedule(4, 2, 2), UsageError);
  EXPECT_THROW(inference_schedule(0, 2, 0), UsageError);
}

}  // namespace
}  // namespace deepspeed::pipe

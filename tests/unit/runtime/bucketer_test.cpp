// The shared bucketing of the reducers (runtime/zero/bucketer.h), in one process: the plan's
// closing rule, hooks that fire once per backward and go with their owner, and the Bucketer's
// in-order launch and buffer pool driven against a fake collective.
#include "runtime/zero/bucketer.h"

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

using Items = std::vector<std::vector<size_t>>;

TEST(PlanBuckets, ReverseOrderClosesBeforeTheLimitIsExceeded) {
  // Items 0..4 of sizes 3, 4, 2, 5, 1, limit 6: from the back 4+3 (1+5), 2+1 (2+4), 0 (3).
  BucketPlan plan = plan_buckets({3, 4, 2, 5, 1}, 6);
  EXPECT_EQ(plan.items, (Items{{4, 3}, {2, 1}, {0}}));
  EXPECT_EQ(plan.bucket_of, (std::vector<size_t>{2, 1, 1, 0, 0}));
  EXPECT_EQ(plan.slot_of, (std::vector<size_t>{0, 1, 0, 1, 0}));
  // Exactly at the limit still fits; one item over the limit gets a bucket of its own.
  EXPECT_EQ(plan_buckets({3, 3}, 6).items, (Items{{1, 0}}));
  EXPECT_EQ(plan_buckets({2, 9, 2}, 6).items, (Items{{2}, {1}, {0}}));
  EXPECT_TRUE(plan_buckets({}, 6).items.empty());
}

TEST(PlanBuckets, DifferentKeysNeverShareABucket) {
  EXPECT_EQ(plan_buckets({1, 1, 1, 1}, 100, {0, 0, 1, 1}).items, (Items{{3, 2}, {1, 0}}));
  EXPECT_EQ(plan_buckets({1, 1, 1}, 100, {0, 1, 0}).items, (Items{{2}, {1}, {0}}));
}

TEST(GradReadyHooks, FireOncePerBackwardAfterAccumulationAndGoWithTheirOwner) {
  torch::Tensor a = torch::ones({3}, torch::requires_grad());
  torch::Tensor b = torch::ones({2}, torch::requires_grad());
  std::vector<std::pair<size_t, double>> fired;  // index, its accumulated gradient's sum
  std::vector<at::Tensor> params{a, b};
  {
    GradReadyHooks hooks(params, [&](size_t i) {
      fired.emplace_back(i, params[i].grad().sum().item<double>());
    });
    (a.sum() * 2 + b.sum() * 5).backward();
    ASSERT_EQ(fired.size(), 2u);
    for (const auto& [i, sum] : fired) EXPECT_EQ(sum, i == 0 ? 6.0 : 10.0);
    (a.sum() * 2).backward();  // b gets no gradient: only a's hook fires
    ASSERT_EQ(fired.size(), 3u);
    EXPECT_EQ(fired.back().first, 0u);
    EXPECT_EQ(fired.back().second, 12.0);  // accumulated: 6 + 6
  }
  (a.sum() + b.sum()).backward();  // hooks removed with their owner
  EXPECT_EQ(fired.size(), 3u);
}

// A fake collective: records every fill, launch and completion in order, and checks that a
// buffer is never filled or launched while another bucket holds it.
struct FakeReducer {
  struct Event {
    char what;  // 'f'ill, 'l'aunch, 'c'omplete
    size_t bucket, slot, buffer;
    bool ready;
  };
  std::vector<Event> events;
  std::map<size_t, size_t> holder;  // buffer -> bucket filling or reducing it

  BucketOps ops() {
    BucketOps o;
    o.fill = [this](size_t b, size_t slot, size_t buffer, bool ready) {
      claim(b, buffer);
      events.push_back({'f', b, slot, buffer, ready});
    };
    o.launch = [this](size_t b, size_t buffer) {
      claim(b, buffer);
      events.push_back({'l', b, 0, buffer, false});
      return std::vector<comm::Handle>{};  // a synchronous fake: nothing to wait for
    };
    o.complete = [this](size_t b, size_t buffer) {
      EXPECT_EQ(holder.at(buffer), b);
      holder.erase(buffer);
      events.push_back({'c', b, 0, buffer, false});
    };
    return o;
  }
  void claim(size_t b, size_t buffer) {
    auto [it, fresh] = holder.emplace(buffer, b);
    EXPECT_EQ(it->second, b) << "buffer " << buffer << " taken by bucket " << b
                             << " while bucket " << it->second << " holds it";
  }
  std::vector<size_t> of(char what) const {  // the buckets of one kind of event, in order
    std::vector<size_t> out;
    for (const auto& e : events) {
      if (e.what == what) out.push_back(e.bucket);
    }
    return out;
  }
  std::string trace() const {
    std::string t;
    for (const auto& e : events) {
      t += std::string(1, e.what) + std::to_string(e.bucket) +
           (e.what == 'f' ? "." + std::to_string(e.slot) : "") + "@" + std::to_string(e.buffer) +
           " ";
    }
    return t;
  }
};

// Five items of one element each, two per bucket: buckets {4,3}, {2,1}, {0}.
BucketPlan five_items() { return plan_buckets({1, 1, 1, 1, 1}, 2); }

BucketerOptions pool(size_t buffers, bool complete_on_launch, bool fill_on_ready = true) {
  BucketerOptions o;
  o.buffers = buffers;
  o.complete_on_launch = complete_on_launch;
  o.fill_on_ready = fill_on_ready;
  return o;
}

// Every item filled exactly once, into the bucket and slot the plan gives it, before that
// bucket's launch; every bucket launched exactly once and completed after its launch.
void expect_one_step(const FakeReducer& fake, const BucketPlan& plan) {
  std::vector<int> fills(plan.bucket_of.size(), 0);
  std::vector<int> launches(plan.items.size(), 0);
  std::vector<int> completions(plan.items.size(), 0);
  for (const auto& e : fake.events) {
    if (e.what == 'f') {
      EXPECT_EQ(launches[e.bucket], 0) << "bucket " << e.bucket << " filled after its launch";
      ++fills[plan.items[e.bucket][e.slot]];
    } else if (e.what == 'l') {
      ++launches[e.bucket];
    } else {
      EXPECT_EQ(launches[e.bucket], 1) << "bucket " << e.bucket << " completed before its launch";
      ++completions[e.bucket];
    }
  }
  for (size_t i = 0; i < fills.size(); ++i) EXPECT_EQ(fills[i], 1) << "item " << i;
  for (size_t b = 0; b < launches.size(); ++b) {
    EXPECT_EQ(launches[b], 1) << "bucket " << b;
    EXPECT_EQ(completions[b], 1) << "bucket " << b;
  }
}

TEST(Bucketer, LaunchesInBucketOrderWhenGradientsArriveOutOfOrder) {
  for (size_t buffers : {size_t{1}, size_t{2}, BucketerOptions::kBufferPerBucket}) {
    FakeReducer fake;
    const BucketPlan plan = five_items();
    Bucketer bucketer(plan, pool(buffers, /*complete_on_launch=*/false), fake.ops());
    bucketer.prepare();
    // Forward order, the reverse of backward's: bucket 2 is complete first, then 1, then 0.
    bucketer.on_ready(0);
    bucketer.on_ready(1);
    bucketer.on_ready(2);
    EXPECT_TRUE(fake.of('l').empty()) << "bucket 0 is not ready: nothing may launch";
    bucketer.on_ready(3);
    EXPECT_TRUE(fake.of('l').empty());
    bucketer.on_ready(4);  // bucket 0 complete: 0, 1 and 2 launch, in that order
    EXPECT_EQ(fake.of('l'), (std::vector<size_t>{0, 1, 2})) << fake.trace();
    EXPECT_EQ(bucketer.buckets_launched_from_hooks(), 3);
    bucketer.flush();
    EXPECT_EQ(fake.of('c'), (std::vector<size_t>{0, 1, 2})) << fake.trace();
    expect_one_step(fake, plan);
    EXPECT_EQ(bucketer.buckets_launched(), 3);
    EXPECT_FALSE(bucketer.armed());
  }
}

TEST(Bucketer, PoolOfOneCompletesEachBucketBeforeTheNextTakesTheBuffer) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(1, /*complete_on_launch=*/true), fake.ops());
  EXPECT_EQ(bucketer.num_buffers(), 1u);
  bucketer.prepare();
  for (size_t i = 5; i-- > 0;) bucketer.on_ready(i);  // backward order
  // Each bucket is filled as its gradients arrive, launched, and completed at once.
  EXPECT_EQ(fake.trace(), "f0.0@0 f0.1@0 l0@0 c0@0 f1.0@0 f1.1@0 l1@0 c1@0 f2.0@0 l2@0 c2@0 ");
  bucketer.flush();
  expect_one_step(fake, plan);
}

TEST(Bucketer, PoolOfTwoAlternatesBuffersAndWaitsForTheOldestWhenBothAreInFlight) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(2, /*complete_on_launch=*/false), fake.ops());
  EXPECT_EQ(bucketer.num_buffers(), 2u);
  bucketer.prepare();
  for (size_t i = 5; i-- > 0;) bucketer.on_ready(i);
  // Buckets 0 and 1 take buffers 0 and 1 and stay in flight; bucket 2 needs a buffer, so bucket
  // 0 completes first and bucket 2 reuses its buffer.
  EXPECT_EQ(fake.trace(), "f0.0@0 f0.1@0 l0@0 f1.0@1 f1.1@1 l1@1 c0@0 f2.0@0 l2@0 ");
  bucketer.flush();
  EXPECT_EQ(fake.of('c'), (std::vector<size_t>{0, 1, 2}));
  expect_one_step(fake, plan);
}

TEST(Bucketer, EarlyGradientsWaitUntilTheirBucketMayTakeAPooledBuffer) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(1, /*complete_on_launch=*/true), fake.ops());
  bucketer.prepare();
  bucketer.on_ready(1);  // bucket 1, which is not the one being filled: no copy yet
  EXPECT_TRUE(fake.events.empty()) << fake.trace();
  bucketer.on_ready(4);  // bucket 0, being filled: copied at once
  EXPECT_EQ(fake.trace(), "f0.0@0 ");
  bucketer.on_ready(3);  // bucket 0 launches; bucket 1's early gradient is copied at its launch
  bucketer.on_ready(2);
  EXPECT_EQ(fake.trace(), "f0.0@0 f0.1@0 l0@0 c0@0 f1.0@0 f1.1@0 l1@0 c1@0 ") << fake.trace();
  bucketer.flush();
  expect_one_step(fake, plan);
}

TEST(Bucketer, OwnBuffersTakeGradientsAtOnceAndCompleteOnlyInFlush) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(BucketerOptions::kBufferPerBucket, false), fake.ops());
  EXPECT_EQ(bucketer.num_buffers(), 3u);
  bucketer.prepare();
  bucketer.on_ready(0);  // bucket 2's buffer is its own: copied at once
  EXPECT_EQ(fake.trace(), "f2.0@2 ");
  for (size_t i = 5; i-- > 1;) bucketer.on_ready(i);
  EXPECT_EQ(fake.of('c').size(), 0u) << fake.trace();
  bucketer.flush();
  EXPECT_EQ(fake.of('c'), (std::vector<size_t>{0, 1, 2}));
  for (const auto& e : fake.events) EXPECT_EQ(e.buffer, e.bucket) << fake.trace();
  expect_one_step(fake, plan);
}

TEST(Bucketer, WithoutFillOnReadyEveryCopyWaitsForTheLaunch) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(2, false, /*fill_on_ready=*/false), fake.ops());
  bucketer.prepare();
  bucketer.on_ready(4);
  EXPECT_TRUE(fake.events.empty());
  bucketer.on_ready(3);
  EXPECT_EQ(fake.trace(), "f0.0@0 f0.1@0 l0@0 ");
  bucketer.flush();
  expect_one_step(fake, plan);
}

TEST(Bucketer, FlushLaunchesMissingGradientsAsNotReadyInOrder) {
  FakeReducer fake;
  const BucketPlan plan = five_items();
  Bucketer bucketer(plan, pool(1, true), fake.ops());
  bucketer.prepare();
  bucketer.on_ready(3);  // only item 3 gets a gradient (bucket 0, slot 1)
  bucketer.flush();
  EXPECT_EQ(fake.of('l'), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(bucketer.buckets_launched(), 3);
  EXPECT_EQ(bucketer.buckets_launched_from_hooks(), 0);
  for (const auto& e : fake.events) {
    if (e.what == 'f') EXPECT_EQ(e.ready, plan.items[e.bucket][e.slot] == 3) << fake.trace();
  }
  expect_one_step(fake, plan);
}

TEST(Bucketer, ResetsBetweenStepsAndIgnoresGradientsWhileDisarmed) {
  for (size_t buffers : {size_t{1}, size_t{2}, BucketerOptions::kBufferPerBucket}) {
    FakeReducer fake;
    const BucketPlan plan = five_items();
    Bucketer bucketer(plan, pool(buffers, buffers != 1), fake.ops());
    // Accumulation micro-steps before the boundary: not armed, nothing happens.
    for (size_t i = 5; i-- > 0;) bucketer.on_ready(i);
    EXPECT_TRUE(fake.events.empty());
    std::string first;
    for (int step = 0; step < 3; ++step) {
      fake.events.clear();
      bucketer.prepare();
      EXPECT_TRUE(bucketer.armed());
      EXPECT_EQ(bucketer.buckets_launched(), 0);
      for (size_t i = 0; i < 5; ++i) EXPECT_FALSE(bucketer.ready(i));
      for (size_t i = 5; i-- > 0;) bucketer.on_ready(i);
      EXPECT_TRUE(bucketer.ready(2));
      EXPECT_TRUE(bucketer.launched(1));
      bucketer.flush();
      expect_one_step(fake, plan);
      EXPECT_EQ(bucketer.buckets_launched(), 3);
      EXPECT_EQ(bucketer.buckets_launched_from_hooks(), 3);
      if (step == 0) first = fake.trace();
      EXPECT_EQ(fake.trace(), first) << "step " << step << " differs from step 0";
      // After flush: disarmed again, late gradients are ignored.
      bucketer.on_ready(0);
      EXPECT_EQ(fake.trace(), first);
    }
  }
}

TEST(Bucketer, NoBucketsNoBuffers) {
  FakeReducer fake;
  Bucketer bucketer(plan_buckets({}, 4), pool(2, false), fake.ops());
  EXPECT_EQ(bucketer.num_buffers(), 0u);
  bucketer.prepare();
  bucketer.flush();
  EXPECT_TRUE(fake.events.empty());
}

}  // namespace
}  // namespace deepspeed::runtime

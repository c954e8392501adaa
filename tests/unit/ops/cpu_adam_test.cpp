// CPU-Adam (src/ops/cpu_adam) against a double-precision evaluation of DeepSpeed's formula, on
// every path this CPU supports: AdamW and L2 modes, with and without weight decay and bias
// correction, awkward lengths, misaligned buffers, bf16/fp16 copies, and thread counts.
#include "ops/cpu_adam/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <tuple>
#include <utility>

#include <gtest/gtest.h>

#include "deepspeed/errors.h"
#include "support/expect_throw.h"
#include "cpu_adam_test_util.h"
#include "ops/cpu_adam/kernel.h"

namespace deepspeed::ops {
namespace {

using testing::AdamBuffers;
using testing::reference_bf16;
using testing::reference_fp16;

constexpr int64_t kOddLengths[] = {0, 1, 7, 15, 17, 1023, 100003};
constexpr int kSteps = 4;

/// One element of one step in double, with its error budget.
struct ReferenceElement {
  double param, exp_avg, exp_avg_sq;
  double tol_param, tol_exp_avg, tol_exp_avg_sq;
};

// DeepSpeed's update (docs/cpu_adam.md) evaluated in double from the kernel's own fp32 state
// before the step, so that each step is judged on its own. The budget allows each fp32
// operation the kernel performs to round once (unit roundoff u = 2^-24) relative to the size of
// the terms it combines, and propagates those errors through sqrt and the division by interval
// bounds; kSlack doubles the whole budget. A kernel that drops a term, reorders the formula or
// mis-handles an element misses it by orders of magnitude.
ReferenceElement reference_step(const AdamStep& s, float p32, float g32, float m32, float v32) {
  constexpr double u = 1.0 / (1 << 24);
  constexpr double kSlack = 2.0;
  const double b1 = s.beta1, b2 = s.beta2, lr = s.lr, eps = s.eps, wd = s.weight_decay;
  const bool decay = wd > 0.0;
  double p = p32, g = g32;
  double g_size = std::fabs(g);
  double g_err = 0.0;
  if (decay && !s.adamw_mode) {
    g += wd * p;
    g_size += wd * std::fabs(p);
    g_err = u * g_size;
  }
  const double m_terms = b1 * std::fabs(m32) + (1.0 - b1) * g_size;
  const double m = b1 * m32 + (1.0 - b1) * g;
  const double m_err = 3.0 * u * m_terms + (1.0 - b1) * g_err;
  const double v = b2 * v32 + (1.0 - b2) * g * g;
  const double v_err = 4.0 * u * (b2 * v32 + (1.0 - b2) * g_size * g_size) +
                       (1.0 - b2) * 2.0 * g_size * g_err;

  double bc1 = 1.0, bc2 = 1.0;
  if (s.bias_correction) {
    bc1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
    bc2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
  }
  const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
  const double denom = std::sqrt(v) * inv_sqrt_bc2 + eps;
  const double sqrt_spread =
      (std::sqrt(v + v_err) - std::sqrt(std::max(0.0, v - v_err))) * inv_sqrt_bc2;
  const double denom_err = sqrt_spread + 3.0 * u * denom;
  const double denom_low = std::max(denom - denom_err, eps * 0.5);
  const double update = m / denom;
  const double update_err =
      m_err / denom_low + std::fabs(m) * denom_err / (denom * denom_low) + u * std::fabs(update);

  double p_err = 0.0;
  if (decay && s.adamw_mode) {
    p_err += u * std::fabs(p) + lr * wd * std::fabs(p) * u;
    p -= lr * wd * p;
  }
  const double step_size = lr / bc1;
  const double p_new = p - step_size * update;
  p_err += u * (std::fabs(p) + std::fabs(p_new)) + step_size * (update_err + u * std::fabs(update));
  return {p_new, m, v, kSlack * p_err, kSlack * m_err, kSlack * v_err};
}

AdamStep make_step(bool adamw_mode, float weight_decay, bool bias_correction, int64_t t) {
  AdamStep s;
  s.lr = 1e-2f;  // large enough that the update is visible in fp32 parameters of size ~1
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.eps = 1e-8f;
  s.weight_decay = weight_decay;
  s.adamw_mode = adamw_mode;
  s.bias_correction = bias_correction;
  s.step = t;
  return s;
}

std::string describe(const AdamStep& s, SimdLevel level, int64_t n, int offset, HalfKind kind) {
  std::ostringstream os;
  os << simd_level_name(level) << " n=" << n << " offset=" << offset << " step=" << s.step
     << (s.adamw_mode ? " adamw" : " l2") << " wd=" << s.weight_decay
     << " bias_correction=" << s.bias_correction
     << " half=" << (kind == HalfKind::kBF16 ? "bf16" : kind == HalfKind::kFP16 ? "fp16" : "none");
  return os.str();
}

// (path, adamw_mode, weight_decay, bias_correction)
using FormulaParam = std::tuple<SimdLevel, bool, float, bool>;
class CpuAdamFormula : public ::testing::TestWithParam<FormulaParam> {};

TEST_P(CpuAdamFormula, MatchesDoublePrecisionReferenceOverSeveralSteps) {
  const auto [level, adamw_mode, weight_decay, bias_correction] = GetParam();
  DS_SKIP_UNLESS_CPU_HAS(level);
  const HalfKind kinds[] = {HalfKind::kNone, HalfKind::kBF16, HalfKind::kFP16};
  int case_index = 0;
  for (int64_t n : kOddLengths) {
    for (int offset : {0, 1}) {
      const HalfKind kind = kinds[case_index++ % 3];
      AdamBuffers b(n, offset);
      testing::fill_initial_state(b, static_cast<uint32_t>(n * 7 + offset));
      for (int64_t t = 1; t <= kSteps; ++t) {
        testing::fill_gradient(b, static_cast<uint32_t>(1000 * t + n + offset));
        const AdamStep s = make_step(adamw_mode, weight_decay, bias_correction, t);
        std::vector<ReferenceElement> ref(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          ref[i] = reference_step(s, b.param[i], b.grad[i], b.exp_avg[i], b.exp_avg_sq[i]);
        }
        adam_update(s, b.param.data(), b.grad.data(), b.exp_avg.data(), b.exp_avg_sq.data(), n,
                    HalfCopy{b.half.data(), kind}, level);

        const std::string where = describe(s, level, n, offset, kind);
        ASSERT_TRUE(b.guards_intact()) << where << ": wrote outside the buffers";
        int64_t failures = 0;
        double worst = 0.0;  // largest error as a fraction of its budget, printed on failure
        for (int64_t i = 0; i < n && failures < 5; ++i) {
          const double dp = std::fabs(b.param[i] - ref[i].param);
          const double dm = std::fabs(b.exp_avg[i] - ref[i].exp_avg);
          const double dv = std::fabs(b.exp_avg_sq[i] - ref[i].exp_avg_sq);
          for (auto [diff, tol] : {std::pair{dp, ref[i].tol_param}, std::pair{dm, ref[i].tol_exp_avg},
                                   std::pair{dv, ref[i].tol_exp_avg_sq}}) {
            if (tol > 0) worst = std::max(worst, diff / tol);
          }
          if (!(dp <= ref[i].tol_param) || !(dm <= ref[i].tol_exp_avg) ||
              !(dv <= ref[i].tol_exp_avg_sq)) {
            ++failures;
            ADD_FAILURE() << where << " element " << i << ": param " << b.param[i] << " vs "
                          << ref[i].param << " (tol " << ref[i].tol_param << "), exp_avg "
                          << b.exp_avg[i] << " vs " << ref[i].exp_avg << " (tol "
                          << ref[i].tol_exp_avg << "), exp_avg_sq " << b.exp_avg_sq[i] << " vs "
                          << ref[i].exp_avg_sq << " (tol " << ref[i].tol_exp_avg_sq << ")";
          }
          if (kind == HalfKind::kBF16 && b.half[i] != reference_bf16(b.param[i])) {
            ++failures;
            ADD_FAILURE() << where << " element " << i << ": bf16 copy " << std::hex << b.half[i]
                          << " of " << b.param[i] << ", expected " << reference_bf16(b.param[i]);
          }
          if (kind == HalfKind::kFP16 && b.half[i] != reference_fp16(b.param[i])) {
            ++failures;
            ADD_FAILURE() << where << " element " << i << ": fp16 copy " << std::hex << b.half[i]
                          << " of " << b.param[i] << ", expected " << reference_fp16(b.param[i]);
          }
        }
        ASSERT_EQ(failures, 0) << where << " (worst error/budget " << worst << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    PathsModesDecayBiasCorrection, CpuAdamFormula,
    ::testing::Combine(::testing::ValuesIn(testing::kAllLevels), ::testing::Bool(),
                       ::testing::Values(0.0f, 0.05f), ::testing::Bool()),
    [](const ::testing::TestParamInfo<FormulaParam>& info) {
      // (std::get, not a structured binding: its commas would split the macro's arguments)
      return std::string(simd_level_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_AdamW" : "_L2") +
             (std::get<2>(info.param) > 0 ? "_Decay" : "_NoDecay") +
             (std::get<3>(info.param) ? "_BiasCorrection" : "_NoBiasCorrection");
    });

// Note [Identical arithmetic on every path] promises bit-identical results, which makes the
// scalar path a reference for the vector ones (and their tails consistent with their bodies).
TEST(CpuAdam, VectorPathsAgreeBitForBitWithScalar) {
  std::cerr << "cpu_adam: this CPU/build runs up to the " << simd_level_name(detect_simd_level())
            << " path\n";
  bool any_vector_path = false;
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level > detect_simd_level()) {
      std::cerr << "NOTE: " << simd_level_name(level) << " not available here; not compared\n";
      continue;
    }
    any_vector_path = true;
    for (bool adamw_mode : {true, false}) {
      for (HalfKind kind : {HalfKind::kNone, HalfKind::kBF16, HalfKind::kFP16}) {
        const int64_t n = 4099;
        AdamBuffers ref(n, 1), vec(n, 3);
        testing::fill_initial_state(ref, 11);
        testing::fill_initial_state(vec, 11);
        for (int64_t t = 1; t <= 3; ++t) {
          testing::fill_gradient(ref, 20 + static_cast<uint32_t>(t));
          testing::fill_gradient(vec, 20 + static_cast<uint32_t>(t));
          const AdamStep s = make_step(adamw_mode, 0.05f, true, t);
          adam_update(s, ref.param.data(), ref.grad.data(), ref.exp_avg.data(),
                      ref.exp_avg_sq.data(), n, HalfCopy{ref.half.data(), kind},
                      SimdLevel::kScalar);
          adam_update(s, vec.param.data(), vec.grad.data(), vec.exp_avg.data(),
                      vec.exp_avg_sq.data(), n, HalfCopy{vec.half.data(), kind}, level);
        }
        const std::string where = describe(make_step(adamw_mode, 0.05f, true, 3), level, n, 3, kind);
        EXPECT_TRUE(testing::same_bits(ref.param.values(), vec.param.values())) << where;
        EXPECT_TRUE(testing::same_bits(ref.exp_avg.values(), vec.exp_avg.values())) << where;
        EXPECT_TRUE(testing::same_bits(ref.exp_avg_sq.values(), vec.exp_avg_sq.values())) << where;
        if (kind != HalfKind::kNone) EXPECT_EQ(ref.half.values(), vec.half.values()) << where;
      }
    }
  }
  if (!any_vector_path) GTEST_SKIP() << "SKIPPED: no vector path on this CPU/build";
}

// A DeepSpeed-independent sanity check of the formula: on the first bias-corrected step
// m_hat = g and v_hat = g^2, so each parameter moves by lr * g / (|g| + eps), i.e. by lr
// against the sign of its gradient.
TEST(CpuAdam, FirstStepMovesEachParameterByLrAgainstItsGradient) {
  for (SimdLevel level : testing::kAllLevels) {
    if (level > detect_simd_level()) continue;
    std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    std::vector<float> g = {0.5f, -3.0f, 1e-3f, -2.0f, 1.0f, 4.0f, -4.0f, 2.0f, 1e3f};
    std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f);
    const std::vector<float> p0 = p;
    AdamStep s;
    s.lr = 1e-3f;
    adam_update(s, p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(p.size()), {},
                level);
    for (size_t i = 0; i < p.size(); ++i) {
      const double expected = p0[i] - 1e-3 * g[i] / (std::fabs(g[i]) + 1e-8);
      EXPECT_NEAR(p[i], expected, 1e-6 * std::max(1.0, std::fabs(expected)))
          << simd_level_name(level) << " element " << i;
      EXPECT_FLOAT_EQ(m[i], (1.0f - 0.9f) * g[i]);
      // (1 - beta2 is formed in fp32, as DeepSpeed does: 1 - 0.999f = 0.00099998713f)
      EXPECT_NEAR(v[i], (1.0f - 0.999f) * static_cast<double>(g[i]) * g[i], 1e-6 * v[i]);
    }
  }
}

/// Runs `steps` updates on a fresh state through adam_update_tiled and returns param|m|v|half.
std::vector<float> run_tiled(SimdLevel level, int64_t n, int64_t tile, int64_t chunk,
                             HalfKind kind, int threads) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  AdamBuffers b(n, 1);
  testing::fill_initial_state(b, 5);
  for (int64_t t = 1; t <= 2; ++t) {
    testing::fill_gradient(b, 50 + static_cast<uint32_t>(t));
    detail::adam_update_tiled(make_step(true, 0.05f, true, t), b.param.data(), b.grad.data(),
                              b.exp_avg.data(), b.exp_avg_sq.data(), n,
                              HalfCopy{b.half.data(), kind}, level, tile, chunk);
  }
  omp_set_num_threads(saved_threads);
  EXPECT_TRUE(b.guards_intact());
  std::vector<float> out = b.param.values();
  for (float x : b.exp_avg.values()) out.push_back(x);
  for (float x : b.exp_avg_sq.values()) out.push_back(x);
  for (uint16_t h : b.half.values()) out.push_back(h);
  return out;
}

TEST(CpuAdam, MultiThreadedEqualsSingleThreaded) {
  // 4 threads on any machine (oversubscribed on 2 cores, which is fine for equality).
  for (SimdLevel level : testing::kAllLevels) {
    if (level > detect_simd_level()) continue;
    for (HalfKind kind : {HalfKind::kNone, HalfKind::kBF16}) {
      const int64_t n = 5 * detail::kAdamChunkNumel + 13;  // several chunks and a tail
      const auto one = run_tiled(level, n, detail::kAdamTileNumel, detail::kAdamChunkNumel, kind, 1);
      const auto four = run_tiled(level, n, detail::kAdamTileNumel, detail::kAdamChunkNumel, kind, 4);
      EXPECT_TRUE(testing::same_bits(one, four)) << simd_level_name(level);
      // Small tiles and odd chunks: every tile is its own parallel loop with ragged chunks.
      const auto ragged = run_tiled(level, n, 10007, 333, kind, 4);
      EXPECT_TRUE(testing::same_bits(one, ragged)) << simd_level_name(level);
    }
  }
}

TEST(CpuAdam, TileAndChunkBoundariesAnywhereGiveTheSameResult) {
  const SimdLevel level = detect_simd_level();
  const int64_t n = 1031;
  const auto whole = run_tiled(level, n, n, n, HalfKind::kFP16, 1);
  // One thread: each tiny tile would otherwise be a parallel region of its own, which costs
  // seconds on a loaded machine (threads are compared in MultiThreadedEqualsSingleThreaded).
  for (int64_t tile : {1, 7, 16, 100, 1030}) {
    for (int64_t chunk : {1, 3, 16, 33, 4096}) {
      EXPECT_TRUE(testing::same_bits(whole, run_tiled(level, n, tile, chunk, HalfKind::kFP16, 1)))
          << "tile " << tile << " chunk " << chunk;
    }
  }
  EXPECT_TRUE(testing::same_bits(whole, run_tiled(level, n, 500, 33, HalfKind::kFP16, 2)));
}

TEST(CpuAdam, DefaultLevelFollowsEnvOverrideButNeverRaisesIt) {
  const SimdLevel detected = detect_simd_level();
  ::unsetenv("DS_CPU_ADAM_SIMD");
  EXPECT_EQ(default_simd_level(), detected);
  ::setenv("DS_CPU_ADAM_SIMD", "scalar", 1);
  EXPECT_EQ(default_simd_level(), SimdLevel::kScalar);
  ::setenv("DS_CPU_ADAM_SIMD", "AVX2", 1);
  EXPECT_EQ(default_simd_level(), std::min(SimdLevel::kAvx2, detected));
  ::setenv("DS_CPU_ADAM_SIMD", "avx512", 1);
  EXPECT_EQ(default_simd_level(), detected);
  ::setenv("DS_CPU_ADAM_SIMD", "sse9", 1);
  EXPECT_THROW_WITH(default_simd_level(), ConfigError, "DS_CPU_ADAM_SIMD='sse9'");
  ::unsetenv("DS_CPU_ADAM_SIMD");
}

// AdamStep::grad_scale multiplies each gradient as it is loaded: the same fp32 product as
// scaling the gradient buffer first, so the same bits on every path, body and tail alike.
TEST(CpuAdam, GradScaleEqualsScalingTheGradientFirst) {
  const float coef = 1.0f / 3.7f;
  for (SimdLevel level : testing::kAllLevels) {
    if (level > detect_simd_level()) continue;
    for (bool adamw_mode : {true, false}) {
      const int64_t n = 1031;
      AdamBuffers scaled(n, 1), fused(n, 2);
      testing::fill_initial_state(scaled, 7);
      testing::fill_initial_state(fused, 7);
      for (int64_t t = 1; t <= 3; ++t) {
        testing::fill_gradient(scaled, 70 + static_cast<uint32_t>(t));
        testing::fill_gradient(fused, 70 + static_cast<uint32_t>(t));
        for (int64_t i = 0; i < n; ++i) scaled.grad[i] = scaled.grad[i] * coef;
        const std::vector<float> grad_before = fused.grad.values();
        AdamStep s = make_step(adamw_mode, 0.05f, true, t);
        adam_update(s, scaled.param.data(), scaled.grad.data(), scaled.exp_avg.data(),
                    scaled.exp_avg_sq.data(), n, HalfCopy{scaled.half.data(), HalfKind::kBF16},
                    level);
        s.grad_scale = coef;
        adam_update(s, fused.param.data(), fused.grad.data(), fused.exp_avg.data(),
                    fused.exp_avg_sq.data(), n, HalfCopy{fused.half.data(), HalfKind::kBF16},
                    level);
        EXPECT_TRUE(testing::same_bits(grad_before, fused.grad.values())) << "gradient written";
      }
      const std::string where = describe(make_step(adamw_mode, 0.05f, true, 3), level, n, 2,
                                         HalfKind::kBF16);
      EXPECT_TRUE(testing::same_bits(scaled.param.values(), fused.param.values())) << where;
      EXPECT_TRUE(testing::same_bits(scaled.exp_avg_sq.values(), fused.exp_avg_sq.values()))
          << where;
      EXPECT_EQ(scaled.half.values(), fused.half.values()) << where;
      EXPECT_TRUE(fused.guards_intact());
    }
  }
}

TEST(CpuAdam, RejectsBadArgumentsByName) {
  float p = 1, g = 1, m = 0, v = 0;
  AdamStep s;
  s.step = 0;
  EXPECT_THROW_WITH(adam_update(s, &p, &g, &m, &v, 1), UsageError, "step is 0");
  s.step = 1;
  EXPECT_THROW_WITH(adam_update(s, &p, &g, &m, &v, -1), UsageError, "n is -1");
  EXPECT_THROW_WITH(adam_update(s, &p, &g, &m, &v, 1, HalfCopy{nullptr, HalfKind::kBF16}),
                    UsageError, "HalfCopy::data is null");
  EXPECT_EQ(p, 1.0f) << "a rejected call must not touch the buffers";
  if (detect_simd_level() < SimdLevel::kAvx512) {
    EXPECT_THROW_WITH(adam_update(s, &p, &g, &m, &v, 1, {}, SimdLevel::kAvx512),
                      NotSupportedError, "avx512 path was requested");
  }
  EXPECT_NO_THROW(adam_update(s, nullptr, nullptr, nullptr, nullptr, 0));
}

}  // namespace
}  // namespace deepspeed::ops

// Zero-bubble schedules (ZB-H1, ZB-H2, ZB-V) and the validator's rules for split backwards (I, W).
#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "pipeline/schedules/schedule.h"
#include "schedule_text.h"
#include "tensor/error.h"

using namespace pipit;
using pipit::testing::order;

namespace {

Task task(Phase phase, int microbatch, int chunk, int stages) {
  return Task{0, microbatch, chunk, phase, chunk % stages};
}

}  // namespace

TEST_CASE("zero-bubble schedules validate within their memory and meet their step time",
          "[pipeline]") {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 4, 8, 16, 32}) {
      for (const std::string name : {"zbh1", "zbh2"}) {
        INFO(name << " p = " << p << " m = " << m);
        // F = I = W = 1: forward 1, backward 2 of which W takes half.
        const ScheduleReport report = validate_schedule(make_schedule(name, p, m, 1), p, m, 1);
        const double theory = theoretical_step_time(name, p, m, 1, 1, 2);
        // With fewer microbatches than stages the pipeline never fills: no formula applies.
        if (m >= p) CHECK(report.makespan == theory);
        for (int s = 0; s < p; ++s) {
          INFO("stage " << s);
          const int activations = name == "zbh1" ? p - s : 2 * (p - s) - 1;
          CHECK(report.peak_stashed[s] == std::min(activations, m));
          CHECK(report.peak_deferred[s] <= (name == "zbh1" ? p : 2 * p));
        }
      }
      if (p > 1 && m >= p) {
        // A third of 1F1B's bubble: (p - 1)(F + I - W) against (p - 1)(F + I + W).
        const double one_f_one_b = validate_schedule(one_f_one_b_schedule(p, m), p, m, 1).makespan;
        const double zbh1 = validate_schedule(zb_h1_schedule(p, m), p, m, 1).makespan;
        CHECK(one_f_one_b - 3 * m == 3 * (p - 1));
        CHECK(zbh1 - 3 * m == p - 1);
      }
    }
  }
}

TEST_CASE("ZB-V: chunks in a V, 1F1B's activations on every stage, the smallest bubble",
          "[pipeline]") {
  for (int p : {1, 2, 3, 4, 8}) {
    CHECK(stage_of_chunk(0, p, Placement::v) == 0);
    CHECK(stage_of_chunk(p - 1, p, Placement::v) == p - 1);
    CHECK(stage_of_chunk(p, p, Placement::v) == p - 1);
    CHECK(stage_of_chunk(2 * p - 1, p, Placement::v) == 0);
    for (int s = 0; s < p; ++s) {
      CHECK(global_chunk(s, 1, p, Placement::v) == 2 * p - 1 - s);
      CHECK(local_chunk(global_chunk(s, 1, p, Placement::v), p, Placement::v) == 1);
    }
    for (int m : {1, 2, 3, 4, 8, 16, 32}) {
      INFO("p = " << p << " m = " << m);
      // F = I = W = 1 per stage, each chunk half of that.
      const ScheduleReport report =
          validate_schedule(make_schedule("zbv", p, m, 2), p, m, 2, Placement::v);
      if (m % p == 0) CHECK(report.makespan == theoretical_step_time("zbv", p, m, 2, 1, 2));
      for (int s = 0; s < p; ++s) {
        INFO("stage " << s);
        // In chunk activations, each half a stage's: 2p is 1F1B's p on stage 0.
        CHECK(report.peak_stashed[s] <= std::min(2 * p, 2 * m));
        CHECK(report.peak_deferred[s] <= p);
      }
      if (p > 1 && m % p == 0) {
        const double interleaved =
            validate_schedule(interleaved_schedule(p, m, 2), p, m, 2).makespan;
        const double zbh1 = validate_schedule(zb_h1_schedule(p, m), p, m, 1).makespan;
        CHECK(report.makespan < zbh1);
        CHECK(report.makespan < interleaved);
      }
    }
  }
  // Fewer deferred W: never more than asked for, and never a shorter step.
  for (const std::string name : {"zbh1", "zbh2", "zbv"}) {
    const int p = 4, m = 8, v = name == "zbv" ? 2 : 1;
    const double full =
        validate_schedule(make_schedule(name, p, m, v), p, m, v, placement_of(name)).makespan;
    for (int d : {1, 2, 3}) {
      INFO(name << " max_deferred " << d);
      const ScheduleReport report =
          validate_schedule(make_schedule(name, p, m, v, "", d), p, m, v, placement_of(name));
      for (int s = 0; s < p; ++s) CHECK(report.peak_deferred[s] <= d);
      CHECK(report.makespan >= full);
    }
  }
  CHECK_THROWS_WITH(make_schedule("1f1b", 2, 4, 1, "", 2),
                    Catch::Contains("max_deferred (2) limits the deferred weight gradients"));
  CHECK_THROWS_WITH(make_schedule("zbv", 2, 4, 2, "", -1),
                    Catch::Contains("max_deferred must be >= 0"));
  // The V's chunks are not where the loop placement puts them.
  CHECK_THROWS_WITH(validate_schedule(make_schedule("zbv", 2, 2, 2), 2, 2, 2),
                    Catch::Contains("lives on stage"));
  CHECK_THROWS_WITH(make_schedule("zbv", 2, 4, 1),
                    Catch::Contains("\"zbv\" runs two chunks per stage"));
}

TEST_CASE("ZB-H2 beats ZB-H1 when weight gradients are a large share", "[pipeline]") {
  // F = 1, I = 1, W = 1 is where they tie; with W = I = 1 and F = 1 but priced as the
  // simulation of uneven costs: tb = 3 of which W = 2/3 (I = 1, W = 2).
  const int p = 4, m = 16;
  const double h1 = validate_schedule(zb_h1_schedule(p, m), p, m, 1, 1, 3, 2.0 / 3).makespan;
  const double h2 = validate_schedule(zb_h2_schedule(p, m), p, m, 1, 1, 3, 2.0 / 3).makespan;
  CHECK(h2 <= h1);
  CHECK(theoretical_step_time("zbh2", p, m, 1, 1, 3, 2.0 / 3) <=
        theoretical_step_time("zbh1", p, m, 1, 1, 3, 2.0 / 3));
}

TEST_CASE("ZB-H1 on two stages, task by task", "[pipeline]") {
  const Schedule schedule = zb_h1_schedule(2, 3);
  REQUIRE(schedule.size() == 2);
  // Stage 1 keeps at most p = 2 weight gradients: after I1 it must run W0 before F2, so stage 0
  // fills the wait for I2 with W1.
  CHECK(order(schedule[0]) == "F0c0 F1c0 I0c0 F2c0 I1c0 W0c0 W1c0 I2c0 W2c0");
  CHECK(order(schedule[1]) == "F0c1 I0c1 F1c1 I1c1 W0c1 F2c1 I2c1 W1c1 W2c1");
}

TEST_CASE("validate_schedule checks split backwards", "[pipeline]") {
  const int p = 2, m = 2;
  const Schedule good = zb_h1_schedule(p, m);
  REQUIRE_NOTHROW(validate_schedule(good, p, m, 1));

  Schedule no_w = good;
  for (auto& tasks : no_w) {
    std::erase_if(tasks, [](const Task& t) {
      return t.phase == Phase::WeightGrad && t.chunk == 1 && t.microbatch == 1;
    });
  }
  CHECK_THROWS_WITH(validate_schedule(no_w, p, m, 1),
                    Catch::Contains("task W1c1 is missing from stage 1"));

  // A B and an I of one microbatch would send its gradient twice.
  Schedule mixed = good;
  mixed[1].push_back(task(Phase::Backward, 0, 1, p));
  CHECK_THROWS_WITH(validate_schedule(mixed, p, m, 1),
                    Catch::Contains("stage 1 runs B0c1 after I1c1"));

  // W before its own I can never run.
  Schedule w_first = {{task(Phase::Forward, 0, 0, 1), task(Phase::WeightGrad, 0, 0, 1),
                       task(Phase::InputGrad, 0, 0, 1)}};
  CHECK_THROWS_WITH(validate_schedule(w_first, 1, 1, 1),
                    Catch::Contains("deadlock: stage 0 waits on I0c0 to run W0c0"));

  // Weight gradients out of microbatch order would sum in another order than sequential
  // accumulation does.
  Schedule w_swapped = {{task(Phase::Forward, 0, 0, 1), task(Phase::Forward, 1, 0, 1),
                         task(Phase::InputGrad, 0, 0, 1), task(Phase::InputGrad, 1, 0, 1),
                         task(Phase::WeightGrad, 1, 0, 1), task(Phase::WeightGrad, 0, 0, 1)}};
  CHECK_THROWS_WITH(validate_schedule(w_swapped, 1, 2, 1),
                    Catch::Contains("stage 0 runs W0c0 after W1c0") &&
                        Catch::Contains("weight gradients (B or W) must run in increasing"));

  CHECK_THROWS_WITH(validate_schedule(good, p, m, 1, 1, 2, 1.5),
                    Catch::Contains("weight-gradient share") && Catch::Contains("1.5"));
  CHECK_THROWS_WITH(make_schedule("zbh1", 2, 4, 2),
                    Catch::Contains("\"zbh1\" runs one chunk per stage"));
}

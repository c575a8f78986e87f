#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "pipeline/schedules/schedule.h"
#include "schedule_text.h"
#include "tensor/error.h"

using namespace pipit;
using pipit::testing::order;

namespace {

Task forward(int microbatch, int chunk, int stages) {
  return Task{0, microbatch, chunk, Phase::Forward, chunk % stages};
}
Task backward(int microbatch, int chunk, int stages) {
  return Task{0, microbatch, chunk, Phase::Backward, chunk % stages};
}

// Megatron's warm-up count for stage s of the interleaved schedule (v >= 2).
int interleaved_warmup(int p, int m, int v, int s) {
  return m == p ? m * v : std::min((p - s - 1) * 2 + (v - 1) * p, m * v);
}

}  // namespace

TEST_CASE("tasks print as phase, microbatch and chunk", "[pipeline]") {
  std::ostringstream out;
  out << forward(3, 1, 2) << " " << backward(0, 5, 2);
  CHECK(out.str() == "F3c1 B0c5");
}

TEST_CASE("gpipe runs all forwards, then all backwards in microbatch order", "[pipeline]") {
  Schedule schedule = gpipe_schedule(2, 3);
  REQUIRE(schedule.size() == 2);
  CHECK(order(schedule[0]) == "F0c0 F1c0 F2c0 B0c0 B1c0 B2c0");
  CHECK(order(schedule[1]) == "F0c1 F1c1 F2c1 B0c1 B1c1 B2c1");
  CHECK(schedule[1][4] == backward(1, 1, 2));
  CHECK(schedule[1][4].stage == 1);
}

TEST_CASE("1f1b warms up p - s - 1 forwards, alternates, then drains", "[pipeline]") {
  Schedule schedule = one_f_one_b_schedule(3, 4);
  REQUIRE(schedule.size() == 3);
  CHECK(order(schedule[0]) == "F0c0 F1c0 F2c0 B0c0 F3c0 B1c0 B2c0 B3c0");
  CHECK(order(schedule[1]) == "F0c1 F1c1 B0c1 F2c1 B1c1 F3c1 B2c1 B3c1");
  CHECK(order(schedule[2]) == "F0c2 B0c2 F1c2 B1c2 F2c2 B2c2 F3c2 B3c2");
  // Fewer microbatches than the warm-up: stage 0 of 4 only warms up with the 2 it has.
  CHECK(order(one_f_one_b_schedule(4, 2)[0]) == "F0c0 F1c0 B0c0 B1c0");
}

TEST_CASE("interleaved follows Megatron's virtual microbatch order", "[pipeline]") {
  // p = 2, m = 4, v = 2: stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3. Virtual
  // forward k runs local chunk (k % 4) / 2 on microbatch (k / 4) * 2 + k % 2; backward k the
  // other local chunk first. Warm-up: stage 0 2 * 1 + 1 * 2 = 4, stage 1 0 + 2 = 2.
  Schedule schedule = interleaved_schedule(2, 4, 2);
  REQUIRE(schedule.size() == 2);
  CHECK(order(schedule[0]) ==
        "F0c0 F1c0 F0c2 F1c2 "                      // warm-up
        "F2c0 B0c2 F3c0 B1c2 F2c2 B0c0 F3c2 B1c0 "  // steady 1F1B
        "B2c2 B3c2 B2c0 B3c0");                     // cool-down
  CHECK(order(schedule[1]) ==
        "F0c1 F1c1 "
        "F0c3 B0c3 F1c3 B1c3 F2c1 B0c1 F3c1 B1c1 F2c3 B2c3 F3c3 B3c3 "
        "B2c1 B3c1");
  // m == p: Megatron runs every forward first.
  CHECK(order(interleaved_schedule(2, 2, 2)[1]) == "F0c1 F1c1 F0c3 F1c3 B0c3 B1c3 B0c1 B1c1");
  // No virtual stages: plain 1F1B (Megatron's formula would warm up 2 (p - s - 1)).
  CHECK(interleaved_schedule(4, 8, 1) == one_f_one_b_schedule(4, 8));
}

TEST_CASE("forward-only schedules run each microbatch through a stage's chunks", "[pipeline]") {
  Schedule schedule = forward_only_schedule(2, 2, 2);
  REQUIRE(schedule.size() == 2);
  CHECK(order(schedule[0]) == "F0c0 F0c2 F1c0 F1c2");
  CHECK(order(schedule[1]) == "F0c1 F0c3 F1c1 F1c3");
}

TEST_CASE("every schedule validates, with the expected stash and step time", "[pipeline]") {
  for (int p : {1, 2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      for (int v : {1, 2}) {
        for (const std::string name : {"gpipe", "1f1b", "interleaved"}) {
          if (name != "interleaved" && v != 1) continue;
          if (name == "interleaved" && m % p != 0) continue;
          INFO(name << " p = " << p << " m = " << m << " v = " << v);
          ScheduleReport report = validate_schedule(make_schedule(name, p, m, v), p, m, v, 1, 2);
          REQUIRE(report.peak_stashed.size() == static_cast<size_t>(p));
          for (int s = 0; s < p; ++s) {
            INFO("stage " << s);
            if (name == "gpipe") {
              CHECK(report.peak_stashed[s] == m);
            } else if (name == "1f1b" || v == 1) {
              CHECK(report.peak_stashed[s] == std::min(p - s, m));
            } else {
              CHECK(report.peak_stashed[s] == std::min(interleaved_warmup(p, m, v, s) + 1, m * v));
            }
          }
          // Costs of 1 and 2 split over v = 2 chunks stay exact in binary, so even the
          // interleaved makespan meets (m + (p - 1) / v)(tf + tb) exactly: in this
          // communication-free model Megatron's order has no bubble beyond the formula.
          CHECK(report.makespan == theoretical_step_time(name, p, m, v, 1, 2));
        }
      }
    }
  }
}

TEST_CASE("interleaved never deadlocks and meets the ideal step time", "[pipeline]") {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      for (int m : {p, 2 * p, 4 * p}) {
        INFO("p = " << p << " m = " << m << " v = " << v);
        ScheduleReport report = validate_schedule(interleaved_schedule(p, m, v), p, m, v, 1, 2);
        CHECK(report.makespan == Approx(theoretical_step_time("interleaved", p, m, v, 1, 2)));
        for (int s = 0; s < p && v > 1; ++s) {
          CHECK(report.peak_stashed[s] == std::min(interleaved_warmup(p, m, v, s) + 1, m * v));
        }
      }
    }
  }
  // The interleaved bubble shrinks with v: p = 4, m = 8 takes 33, then 28.5, then 27.
  CHECK(validate_schedule(interleaved_schedule(4, 8, 1), 4, 8, 1).makespan == 33);
  CHECK(validate_schedule(interleaved_schedule(4, 8, 2), 4, 8, 2).makespan == 28.5);
}

TEST_CASE("the simulation uses the given costs", "[pipeline]") {
  // One stage: everything in sequence.
  CHECK(validate_schedule(gpipe_schedule(1, 3), 1, 3, 1, 1.5, 0.5).makespan == 6);
  // GPipe, p = 2, m = 1, tf = 1, tb = 3: F on 0, F on 1, B on 1, B on 0.
  CHECK(validate_schedule(gpipe_schedule(2, 1), 2, 1, 1, 1, 3).makespan == 8);
  CHECK_THROWS_WITH(validate_schedule(gpipe_schedule(2, 1), 2, 1, 1, -1, 3),
                    Catch::Contains("validate_schedule") && Catch::Contains("-1"));
}

TEST_CASE("validate_schedule rejects malformed schedules", "[pipeline]") {
  const int p = 2, m = 2;
  Schedule good = one_f_one_b_schedule(p, m);
  REQUIRE_NOTHROW(validate_schedule(good, p, m, 1));

  CHECK_THROWS_WITH(validate_schedule(good, 3, m, 1),
                    Catch::Contains("2 stage lists for 3 stages"));

  Schedule missing = good;
  missing[1].pop_back();
  CHECK_THROWS_WITH(validate_schedule(missing, p, m, 1),
                    Catch::Contains("task B1c1 is missing from stage 1"));

  Schedule duplicated = good;
  duplicated[0].push_back(forward(1, 0, p));
  CHECK_THROWS_WITH(validate_schedule(duplicated, p, m, 1),
                    Catch::Contains("task F1c0 appears twice on stage 0"));

  Schedule wrong_stage = good;
  wrong_stage[0].push_back(wrong_stage[1].back());
  wrong_stage[1].pop_back();
  CHECK_THROWS_WITH(validate_schedule(wrong_stage, p, m, 1),
                    Catch::Contains("task B1c1 is on stage 0 but chunk 1 lives on stage 1"));

  Schedule mislabelled = good;
  mislabelled[1][0].stage = 0;
  CHECK_THROWS_WITH(validate_schedule(mislabelled, p, m, 1),
                    Catch::Contains("task F0c1 in stage 1's list says stage 0"));

  Schedule unknown = good;
  unknown[0].push_back(forward(2, 0, p));
  CHECK_THROWS_WITH(validate_schedule(unknown, p, m, 1),
                    Catch::Contains("unknown task F2c0 on stage 0 (m = 2, 2 chunks)"));

  // Swapping the drained backwards breaks sequential gradient accumulation order.
  Schedule reordered = good;
  std::swap(reordered[0][2], reordered[0][3]);
  CHECK(order(reordered[0]) == "F0c0 F1c0 B1c0 B0c0");
  CHECK_THROWS_WITH(validate_schedule(reordered, p, m, 1),
                    Catch::Contains("stage 0 runs B0c0 after B1c0") &&
                        Catch::Contains("increasing microbatch order"));
  Schedule forwards_reordered = gpipe_schedule(p, m);
  std::swap(forwards_reordered[1][0], forwards_reordered[1][1]);
  CHECK_THROWS_WITH(
      validate_schedule(forwards_reordered, p, m, 1),
      Catch::Contains("stage 1 runs F0c1 after F1c1") && Catch::Contains("forwards must run"));
}

TEST_CASE("validate_schedule reports deadlocks with the blocked tasks", "[pipeline]") {
  // Stage 1 tries its backward before the forward that feeds the loss.
  Schedule backward_first = {{forward(0, 0, 2), backward(0, 0, 2)},
                             {backward(0, 1, 2), forward(0, 1, 2)}};
  CHECK_THROWS_WITH(validate_schedule(backward_first, 2, 1, 1),
                    Catch::Contains("deadlock: stage 0 waits on B0c1 to run B0c0; "
                                    "stage 1 waits on F0c1 to run B0c1"));
  // Each stage waits for the other: stage 0 wants microbatch 0's gradient before it sends
  // microbatch 1's activation, which stage 1 wants before it computes that gradient.
  Schedule cycle = {{forward(0, 0, 2), backward(0, 0, 2), forward(1, 0, 2), backward(1, 0, 2)},
                    {forward(0, 1, 2), forward(1, 1, 2), backward(0, 1, 2), backward(1, 1, 2)}};
  CHECK_THROWS_WITH(validate_schedule(cycle, 2, 2, 1),
                    Catch::Contains("deadlock: stage 0 waits on B0c1 to run B0c0; "
                                    "stage 1 waits on F1c0 to run F1c1"));
}

TEST_CASE("make_schedule and theoretical_step_time check names and sizes", "[pipeline]") {
  CHECK(make_schedule("gpipe", 2, 3, 1) == gpipe_schedule(2, 3));
  CHECK(make_schedule("1f1b", 3, 4, 1) == one_f_one_b_schedule(3, 4));
  CHECK(make_schedule("interleaved", 2, 4, 2) == interleaved_schedule(2, 4, 2));
  CHECK_THROWS_WITH(
      make_schedule("1f1b", 2, 4, 2),
      Catch::Contains("\"1f1b\" runs one chunk per stage, got chunks_per_stage = 2") &&
          Catch::Contains("\"interleaved\""));
  CHECK_THROWS_WITH(make_schedule("gpipe", 2, 4, 3), Catch::Contains("\"gpipe\""));
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 6, 2),
                    Catch::Contains("interleaved_schedule: microbatches (6) must be a multiple "
                                    "of stages (4)"));
  CHECK_THROWS_WITH(make_schedule("zigzag", 2, 4, 1),
                    Catch::Contains("unknown schedule \"zigzag\"") && Catch::Contains("gpipe") &&
                        Catch::Contains("1f1b") && Catch::Contains("interleaved"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 0, 4, 1),
                    Catch::Contains("make_schedule") && Catch::Contains("p = 0, m = 4, v = 1"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 2, 0, 1), Catch::Contains("m = 0"));
  CHECK_THROWS_WITH(make_schedule("interleaved", 2, 2, 0), Catch::Contains("v = 0"));
  CHECK_THROWS_WITH(gpipe_schedule(-1, 2), Catch::Contains("gpipe_schedule"));

  CHECK(theoretical_step_time("gpipe", 4, 8, 1, 1, 2) == 33);
  CHECK(theoretical_step_time("1f1b", 4, 8, 3, 1, 2) == 33);  // v does not apply
  CHECK(theoretical_step_time("interleaved", 4, 8, 2, 1, 2) == 28.5);
  CHECK_THROWS_WITH(theoretical_step_time("zigzag", 4, 8, 1, 1, 2),
                    Catch::Contains("theoretical_step_time: unknown schedule \"zigzag\""));
}

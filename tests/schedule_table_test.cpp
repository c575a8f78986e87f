// Schedules written by hand as tables (pipeline/schedules/schedule.h, parse_schedule_table):
// parsed, validated before use with the first bad token or task named, and run bit for bit like the
// built-in schedule they spell out.
#include <catch2/catch.hpp>

#include "bitwise.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedules/schedule.h"
#include "pipit.h"
#include "schedule_text.h"

using namespace pipit;
using pipit::testing::bitwise_equal;
using pipit::testing::table_of;

TEST_CASE("a schedule table parses into the schedule it spells", "[pipeline]") {
  CHECK(parse_schedule_table("F0 F1 I0 W0 I1 W1\nF0 I0 F1 I1 W0 W1\n", 2, 2, 1) ==
        zb_h1_schedule(2, 2));
  // Chunks spelled out, comments and blank lines skipped.
  CHECK(parse_schedule_table("# zbh1, p = 2\n\nF0c0 F1c0 I0c0 W0c0 I1c0 W1c0  # stage 0\n"
                             "F0c1 I0c1 F1c1 I1c1 W0c1 W1c1\n",
                             2, 2, 1) == zb_h1_schedule(2, 2));
  // Every built-in schedule round-trips through its printed table.
  for (const std::string name : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
    INFO(name);
    const Schedule schedule = make_schedule(name, 3, 6, 1);
    CHECK(make_schedule("table", 3, 6, 1, table_of(schedule)) == schedule);
  }
  const Schedule interleaved = interleaved_schedule(2, 4, 2);
  CHECK(parse_schedule_table(table_of(interleaved), 2, 4, 2) == interleaved);
}

TEST_CASE("a bad schedule table is refused naming the first bad token or task", "[pipeline]") {
  const auto refused = [](const std::string& table, int p, int m, int v) {
    try {
      parse_schedule_table(table, p, m, v);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("F0 F1 I0 W0 X1 W1\nF0 I0 F1 I1 W0 W1\n", 2, 2, 1),
             Catch::Contains("line 1 (stage 0): \"X1\" is not a task"));
  CHECK_THAT(refused("F0 F1 I0 W0 I1 W1\nF0 I0 F1 I1 W0 Wx\n", 2, 2, 1),
             Catch::Contains("line 2 (stage 1): \"Wx\" has no microbatch number"));
  CHECK_THAT(refused("F0c0 F1c0x\n", 1, 2, 1), Catch::Contains("\"F1c0x\" has trailing"));
  CHECK_THAT(refused("F0 F1 B0 B1\n", 2, 2, 2),
             Catch::Contains("\"F0\" needs its chunk (c<chunk>): each stage holds 2"));
  CHECK_THAT(refused("F0 F1 I0 W0 I1 W1\n", 2, 2, 1),
             Catch::Contains("1 lines of tasks for 2 stages"));
  CHECK_THAT(refused("F0 B0\nF0 B0\nF0 B0\n", 2, 1, 1),
             Catch::Contains("line 3: more lines of tasks than the 2 stages"));
  // A dropped task, and a table that deadlocks: the validator names the task.
  CHECK_THAT(refused("F0 F1 I0 W0 I1 W1\nF0 I0 F1 I1 W0\n", 2, 2, 1),
             Catch::Contains("task W1c1 is missing from stage 1"));
  CHECK_THAT(refused("F0 I0 F1 W0 I1 W1\nF0 F1 I1 I0 W0 W1\n", 2, 2, 1),
             Catch::Contains("stage 1 runs I0c1 after I1c1"));
  CHECK_THAT(refused("F0 F1 I0 I1 W0 W1\nF0 I0 W0 I1 F1 W1\n", 2, 2, 1),
             Catch::Contains("deadlock: stage 0 waits on I1c1 to run I1c0; stage 1 waits on "
                             "F1c1 to run I1c1"));
  CHECK_THAT(refused("F0c1 B0c1\nF0c0 B0c0\n", 2, 1, 1),
             Catch::Contains("task F0c1 is on stage 0 but chunk 1 lives on stage 1"));

  CHECK_THROWS_WITH(make_schedule("table", 2, 2, 1),
                    Catch::Contains("\"table\" needs the table of tasks"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 2, 2, 1, "F0 B0\nF0 B0\n"),
                    Catch::Contains("the schedule is \"1f1b\"; name it \"table\""));
}

TEST_CASE("a pipeline runs a schedule table bit for bit like the built-in schedule", "[pipeline]") {
  // ZB-H2 for p = 2, m = 4 spelled as a table trains exactly like "zbh2".
  Generator g(31);
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < 8 * 6; ++i) {
    x.push_back((i * 3) % 11);
    y.push_back((i * 5 + 2) % 11);
  }
  const Tensor input = from_vector(x, {8, 6}), target = from_vector(y, {8, 6});
  auto train = [&](const std::string& schedule, const std::string& table) {
    Generator generator(5);
    auto model = gpt(GptConfig{11, 6, 4, 2, 16, 0.0}, &generator);
    PipelineConfig config;
    config.stages = 2;
    config.microbatches = 4;
    config.schedule = schedule;
    config.schedule_table = table;
    Pipeline pipeline(model, config);
    for (int step = 0; step < 2; ++step) pipeline.train_step(input, target);
    return model->state_dict();
  };
  const StateDict built_in = train("zbh2", "");
  const StateDict from_table = train("table", table_of(zb_h2_schedule(2, 4)));
  for (const auto& [name, value] : built_in) {
    INFO(name);
    CHECK(bitwise_equal(from_table.at(name), value));
  }
}

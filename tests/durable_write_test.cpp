// Durable writes: a file or model directory is replaced whole or not at all. Concurrent
// writers never share a temporary, every failing step (the close and the directory fsync
// included) is an error naming the path, and no failure leaves a temporary behind or costs
// the previous contents. Failures the file system will not produce on demand are injected
// through set_file_fault_hook.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec/atomic_file.h"
#include "codec/durable_fs.h"
#include "file_faults.h"
#include "nn/builders.h"
#include "nn/registry.h"
#include "pipit.h"
#include "serialize/checkpoint.h"
#include "serialize/model_io.h"

using namespace pipit;
using namespace pipit::testing;
namespace fs = std::filesystem;

namespace {}  // namespace

TEST_CASE("concurrent writers of one file leave one writer's whole contents and no temporaries",
          "[serialize][durable]") {
  const TempDir dir("durable_concurrent");
  const std::string path = (dir / "shared.bin").string();
  constexpr int kWriters = 6, kRounds = 10;
  constexpr size_t kBytes = 256 << 10;  // large enough for writes to interleave
  auto contents = [&](int writer, int round) {
    std::string s(kBytes, static_cast<char>('A' + writer));
    s.replace(0, 8, std::to_string(10000000 + round));
    return s;
  };
  std::set<std::string> written;
  for (int w = 0; w < kWriters; ++w) {
    for (int r = 0; r < kRounds; ++r) written.insert(contents(w, r));
  }
  write_file_atomic(path, contents(0, 0));

  std::atomic<int> failures{0}, running{kWriters};
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int r = 0; r < kRounds; ++r) {
        try {
          write_file_atomic(path, contents(w, r));
        } catch (const Error& e) {
          ++failures;
          errors[w] = e.what();
        }
      }
      --running;
    });
  }
  // Every read while they write sees one writer's complete contents.
  int reads = 0, torn = 0;
  while (running > 0) {
    ++reads;
    torn += written.count(read_file(path)) == 0;
  }
  for (std::thread& t : writers) t.join();
  for (const std::string& e : errors) CHECK(e.empty());
  CHECK(failures == 0);
  CHECK(torn == 0);
  CHECK(reads > 0);
  CHECK(written.count(read_file(path)) == 1);
  CHECK(entries(dir.path) == std::set<std::string>{"shared.bin"});
}

TEST_CASE("a write that fails at any step throws naming the path and keeps the old file",
          "[serialize][durable]") {
  const TempDir dir("durable_faults");
  const std::string path = (dir / "data.bin").string();
  write_file_atomic(path, "old contents");
  struct Case {
    FileStep step;
    const char* names;  // what the error must name
  };
  for (const Case& c : {Case{FileStep::Create, ".data.bin.tmp."}, Case{FileStep::Write, ".tmp."},
                        Case{FileStep::Sync, ".tmp."}, Case{FileStep::Close, ".tmp."},
                        Case{FileStep::Rename, "data.bin"}}) {
    INFO("failing step " << static_cast<int>(c.step));
    const InjectFault fault(c.step, "data.bin");
    CHECK_THROWS_WITH(write_file_atomic(path, "new contents"),
                      Catch::Contains(c.names) && Catch::Contains(kEio));
    CHECK(read_file(path) == "old contents");
    CHECK(entries(dir.path) == std::set<std::string>{"data.bin"});
  }
  {
    // Too late to keep the old file, but the caller must know the new one may not last.
    const InjectFault fault(FileStep::SyncDir, dir.path.string());
    CHECK_THROWS_WITH(write_file_atomic(path, "new contents"),
                      Catch::Contains("'" + path + "'") &&
                          Catch::Contains("may not survive a crash") && Catch::Contains(kEio));
    CHECK(read_file(path) == "new contents");
    CHECK(entries(dir.path) == std::set<std::string>{"data.bin"});
  }
}

TEST_CASE("writes whose directory is missing or whose rename fails leave nothing behind",
          "[serialize][durable]") {
  const TempDir dir("durable_real_faults");
  CHECK_THROWS_WITH(write_file_atomic((dir / "missing" / "x.bin").string(), "x"),
                    Catch::Contains("cannot create") && Catch::Contains("missing"));
  CHECK(entries(dir.path).empty());
  // A non-empty directory cannot be renamed over: the rename is the step that fails.
  fs::create_directories(dir / "target" / "inside");
  CHECK_THROWS_WITH(write_file_atomic((dir / "target").string(), "x"),
                    Catch::Contains("cannot rename") && Catch::Contains("target"));
  CHECK(entries(dir.path) == std::set<std::string>{"target"});
  CHECK(entries(dir / "target") == std::set<std::string>{"inside"});
}

TEST_CASE("a leftover temporary that holds the next name is skipped, not taken over",
          "[serialize][durable]") {
  const TempDir dir("durable_leftover");
  const std::string path = (dir / "f").string();
  int refusals = 0;
  set_file_fault_hook([&](FileStep step, const std::string&) {
    return step == FileStep::Create && refusals++ < 3 ? EEXIST : 0;
  });
  write_file_atomic(path, "written");
  set_file_fault_hook(nullptr);
  CHECK(refusals == 4);
  CHECK(read_file(path) == "written");
  CHECK(entries(dir.path) == std::set<std::string>{"f"});
}

TEST_CASE("temporaries of writers that died are removed; a live writer's are kept",
          "[serialize][durable]") {
  const TempDir dir("durable_stale");
  // A pid that no longer runs: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(dead > 0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string stale_file = ".ckpt.tmp." + std::to_string(dead) + ".0";
  const std::string stale_dir = ".ckpt.tmp." + std::to_string(dead) + ".1";
  const std::string live = ".ckpt.tmp." + std::to_string(::getppid()) + ".0";
  const std::string unrelated = ".other.tmp." + std::to_string(dead) + ".0";
  for (const std::string& name : {stale_file, live, unrelated}) {
    std::ofstream(dir / name) << "partial";
  }
  fs::create_directories(dir / stale_dir / "inner");
  write_file_atomic((dir / "ckpt").string(), "whole");
  CHECK(read_file((dir / "ckpt").string()) == "whole");
  CHECK(entries(dir.path) == std::set<std::string>{"ckpt", live, unrelated});
}

TEST_CASE("a checkpoint save that fails keeps the previous checkpoint loadable",
          "[checkpoint][durable]") {
  const TempDir dir("durable_checkpoint");
  const std::string path = (dir / "ckpt.safetensors").string();
  Checkpoint previous;
  previous.model_config = {{"type", "Linear"}};
  previous.weights = {{"w", from_vector<float>({1, 2, 3})}};
  previous.step = 7;
  save_checkpoint(path, previous);
  Checkpoint next = previous;
  next.weights = {{"w", from_vector<float>({4, 5, 6})}};
  next.step = 8;
  for (const FileStep step : {FileStep::Write, FileStep::Sync, FileStep::Close, FileStep::Rename}) {
    INFO("failing step " << static_cast<int>(step));
    const InjectFault fault(step, "ckpt.safetensors");
    CHECK_THROWS_WITH(save_checkpoint(path, next),
                      Catch::Contains("ckpt.safetensors") && Catch::Contains(kEio));
    const Checkpoint loaded = load_checkpoint(path);
    CHECK(loaded.step == 7);
    CHECK(loaded.weights.at("w").to_vector<float>() == std::vector<float>{1, 2, 3});
    CHECK(entries(dir.path) == std::set<std::string>{"ckpt.safetensors"});
  }
}

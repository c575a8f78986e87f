// Chaos and soak, short versions (the long ones: samples/chaos.sh). The driver is
// tools/chaos/: this test starts its own executable in the worker and trainer roles
// (tests/main.cpp --chaos-role), so it runs in every build, the sanitizer one included.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "tools/chaos/driver.h"
#include "tools/chaos/soak.h"

using namespace pipit::chaos;
namespace fs = std::filesystem;

namespace {

// GCC defines __SANITIZE_ADDRESS__; clang answers __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define PIPIT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PIPIT_TEST_ASAN 1
#endif
#endif
#ifdef PIPIT_TEST_ASAN
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

ClusterOptions cluster_options(const std::string& name) {
  ClusterOptions cluster;
  cluster.programs = Programs::roles(fs::read_symlink("/proc/self/exe").string());
  cluster.dir = (fs::temp_directory_path() / (name + "_" + std::to_string(getpid()))).string();
  // Generous for a loaded 2-core machine: a false timeout would fail the test.
  cluster.peer_timeout = std::chrono::milliseconds(kSanitized ? 3000 : 2000);
  cluster.heartbeat = std::chrono::milliseconds(250);
  cluster.step_timeout = std::chrono::milliseconds(8000);
  cluster.connect_timeout = std::chrono::milliseconds(5000);
  cluster.trainer_args = {"--layers", "1", "--width",        "16", "--context", "8",
                          "--batch",  "4", "--microbatches", "2"};
  return cluster;
}

}  // namespace

TEST_CASE(
    "chaos: every fault ends in an error naming the peer or file, checkpoints survive, "
    "and the resumed run ends bit for bit where an uninterrupted one does",
    "[chaos]") {
  ChaosOptions options;
  options.cluster = cluster_options("pipit_chaos");
  options.cluster.workers = 3;
  options.seed = 2024;
  // One of each kind that needs no long wait, and one timeout. Every flipped byte, in a header
  // or in tensor data, must fail its frame's checksum.
  options.kinds = {
      FaultKind::KillWorker,     FaultKind::Cut,      FaultKind::KillCoordinatorCheckpoint,
      FaultKind::StopWorkerKill, FaultKind::DiskFull, FaultKind::Flip,
      FaultKind::FlipData};
  options.faults = static_cast<int>(options.kinds.size());
  // Room for every fault even when each one costs a few steps: a run that finishes early
  // leaves the later faults uninjected.
  options.steps = 60;
  options.checkpoint_every = 3;
  options.slack = std::chrono::milliseconds(kSanitized ? 4000 : 2000);
  options.max_duration = std::chrono::seconds(240);
  std::string log;
  options.log = [&](const std::string& line) { log += line + "\n"; };
  const ChaosReport report = ChaosSession(options).run();
  INFO(log);
  for (const std::string& note : report.notes) WARN(note);
  // Every kind at least once, but one this machine cannot inject, which a note names (disk-full
  // without a tmpfs to fill).
  for (FaultKind kind : options.kinds) {
    const std::string name = fault_name(kind);
    INFO(name);
    const bool injected =
        std::any_of(report.faults.begin(), report.faults.end(),
                    [&](const auto& f) { return f.fault.kind == kind && f.injected; });
    const bool skipped = std::any_of(report.notes.begin(), report.notes.end(), [&](const auto& n) {
      return n.starts_with(name + " SKIPPED");
    });
    CHECK((injected || skipped));
  }
  for (const std::string& failure : report.all_failures()) {
    INFO(failure);
    CHECK(false);
  }
  CHECK(report.final_versus_reference.empty());
  std::error_code ignored;
  if (report.ok()) fs::remove_all(options.cluster.dir, ignored);
}

TEST_CASE("soak: the coordinator's and the workers' memory and descriptors stay flat",
          "[chaos][soak]") {
  SoakOptions options;
  options.cluster = cluster_options("pipit_soak");
  options.cluster.workers = 2;
  options.steps = kSanitized ? 150 : 400;
  options.checkpoint_every = 50;
  options.samples = 8;
  options.warmup = 0.25;
  // ASan keeps freed memory in quarantine, so RSS grows by design there; descriptors are
  // checked in every build.
  options.check_rss = !kSanitized;
  options.rss_tolerance_kib = 1024;
  options.max_duration = std::chrono::seconds(120);
  std::string log;
  options.log = [&](const std::string& line) { log += line + "\n"; };
  const SoakReport report = run_soak(options);
  INFO(log);
  INFO((report.samples.empty() ? "no samples" : report.table()));
  for (const std::string& failure : report.failures) {
    INFO(failure);
    CHECK(false);
  }
  std::error_code ignored;
  if (report.failures.empty()) fs::remove_all(options.cluster.dir, ignored);
}

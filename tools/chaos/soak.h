#pragma once
// A soak: one long distributed run of tiny steps (checkpoints included) while the driver
// samples every process's resident memory and open descriptors from /proc. Memory and
// descriptors must stay flat between the end of a warm-up and the end of the run: descriptors
// exactly, memory within a tolerance (allocators keep what they once used, so a few hundred
// KiB of drift is not a leak; a leak of 1 KiB per step over thousands of steps is several MiB).
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tools/chaos/cluster.h"
#include "tools/chaos/proc_stats.h"

namespace pipit::chaos {

struct SoakOptions {
  ClusterOptions cluster;  // proxies are turned off: the driver's own sockets are not measured
  int64_t steps = 3000, checkpoint_every = 100;
  int samples = 20;     // evenly spaced over the run
  double warmup = 0.1;  // the fraction of the run before the baseline sample
  long rss_tolerance_kib = 2048;
  bool check_rss = true;  // off under ASan: its quarantine holds freed memory
  std::chrono::seconds max_duration{900};
  std::function<void(const std::string&)> log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
};

struct SoakSample {
  int64_t step = 0;
  std::vector<ProcStats> stats;  // the coordinator, then worker 0, 1, ...
};

struct SoakReport {
  std::vector<SoakSample> samples;
  size_t baseline = 0;  // index of the sample after the warm-up
  std::vector<std::string> failures;
  double seconds = 0;

  // Markdown: each process's RSS and descriptors at the first step, after the warm-up and at
  // the end.
  std::string table() const {
    std::string out = "| process | RSS after step " + std::to_string(samples.front().step) +
                      " | RSS after step " + std::to_string(samples[baseline].step) +
                      " | RSS after step " + std::to_string(samples.back().step) +
                      " | fds (same three points) |\n| --- | --- | --- | --- | --- |\n";
    for (size_t p = 0; p < samples.front().stats.size(); ++p) {
      const ProcStats &a = samples.front().stats[p], &b = samples[baseline].stats[p],
                      &c = samples.back().stats[p];
      char line[256];
      std::snprintf(line, sizeof line,
                    "| %s | %ld KiB | %ld KiB | %ld KiB (%+ld) | %ld, %ld, %ld |\n",
                    p == 0 ? "coordinator" : ("worker " + std::to_string(p - 1)).c_str(), a.rss_kib,
                    b.rss_kib, c.rss_kib, c.rss_kib - b.rss_kib, a.fds, b.fds, c.fds);
      out += line;
    }
    return out;
  }
};

inline SoakReport run_soak(SoakOptions options) {
  const auto start = Clock::now(), deadline = start + options.max_duration;
  options.cluster.proxies = false;
  for (const std::string& arg :
       {std::string("--steps"), std::to_string(options.steps), std::string("--checkpoint-every"),
        std::to_string(options.checkpoint_every)}) {
    options.cluster.trainer_args.push_back(arg);
  }
  Cluster cluster(options.cluster);
  cluster.start_trainer(options.cluster.dir + "/soak-checkpoints", false, "soak");
  ChildProcess& trainer = *cluster.trainer();
  SoakReport report;
  // Samples fall half-way between checkpoints (a checkpoint write holds a descriptor or two):
  // after "step s" with s = every/2 mod every.
  const int64_t every = std::max<int64_t>(2, options.checkpoint_every);
  const int64_t interval = std::max<int64_t>(1, options.steps / options.samples / every) * every;
  int64_t next = 1;
  while (trainer.running() && Clock::now() < deadline) {
    const int64_t step = cluster.step();
    if (step >= next && step < options.steps) {
      SoakSample sample{step, {proc_stats(trainer.pid())}};
      for (int i = 0; i < cluster.size(); ++i)
        sample.stats.push_back(proc_stats(cluster.worker(i).pid()));
      if (report.samples.empty() || step < options.warmup * static_cast<double>(options.steps)) {
        report.baseline = report.samples.size();
      }
      report.samples.push_back(sample);
      char line[160];
      std::snprintf(line, sizeof line,
                    "soak: step %lld, coordinator %ld KiB %ld fds, worker 0 %ld KiB %ld fds",
                    static_cast<long long>(step), sample.stats[0].rss_kib, sample.stats[0].fds,
                    sample.stats[1].rss_kib, sample.stats[1].fds);
      options.log(line);
      next = (step / interval + 1) * interval + every / 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (trainer.running()) report.failures.push_back("the soak run did not finish in time");
  trainer.wait_exit(Clock::now() + std::chrono::seconds(30));
  if (trainer.exit_status() != 0) {
    report.failures.push_back("the soak run failed: " + cluster.trainer_error());
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (report.samples.size() < 3) {
    report.failures.push_back("too few samples: " + std::to_string(report.samples.size()));
    return report;
  }
  report.baseline = std::min(report.baseline + 1, report.samples.size() - 2);
  const SoakSample &base = report.samples[report.baseline], &end = report.samples.back();
  for (size_t p = 0; p < base.stats.size(); ++p) {
    const std::string who = p == 0 ? "the coordinator" : "worker " + std::to_string(p - 1);
    if (end.stats[p].fds != base.stats[p].fds) {
      report.failures.push_back(who + "'s descriptors went from " +
                                std::to_string(base.stats[p].fds) + " to " +
                                std::to_string(end.stats[p].fds));
    }
    const long growth = end.stats[p].rss_kib - base.stats[p].rss_kib;
    if (options.check_rss && growth > options.rss_tolerance_kib) {
      report.failures.push_back(who + "'s RSS grew by " + std::to_string(growth) +
                                " KiB (from step " + std::to_string(base.step) + " to " +
                                std::to_string(end.step) + "), over the " +
                                std::to_string(options.rss_tolerance_kib) + " KiB allowed");
    }
  }
  return report;
}

}  // namespace pipit::chaos

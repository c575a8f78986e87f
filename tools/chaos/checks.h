#pragma once
// ChaosChecks: how a chaos session judges a fault (tools/chaos/driver.h injects them): the
// error the trainer or the workers report, its words and its time against the configured
// timeouts; crashes and sanitizer reports; the latest checkpoint, which must load, never go
// back, and equal the uninterrupted run's at its step. It also holds the session's state.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include "tools/chaos/checkpoint_dir.h"
#include "tools/chaos/checkpoint_trap.h"
#include "tools/chaos/cluster.h"
#include "tools/chaos/faults.h"
#include "tools/chaos/reference.h"
#include "tools/chaos/report.h"
#include "tools/chaos/worker_watch.h"

namespace pipit::chaos {

struct ChaosOptions {
  ClusterOptions cluster;  // trainer_args: the model's flags; --steps etc. are added here
  uint64_t seed = 1;
  int faults = 5;
  std::vector<FaultKind> kinds = default_fault_kinds();
  std::vector<Region> flip_regions = header_regions();
  int64_t steps = 24, checkpoint_every = 3;
  size_t tmpfs_bytes = size_t{4} << 20;   // 0: a plain directory, no disk-full faults
  std::chrono::milliseconds slack{2000};  // added to every timeout the faults are judged by
  std::chrono::seconds max_duration{900};
  std::function<void(const std::string&)> log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
};

class ChaosChecks {
 protected:
  explicit ChaosChecks(ChaosOptions options) : options_(std::move(options)) {}

  void log(const std::string& text) { options_.log(text); }
  double ms_since(Clock::time_point t) const {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  }
  double ms(std::chrono::milliseconds d) const { return static_cast<double>(d.count()); }
  std::chrono::milliseconds to_ms(double value) const {
    return std::chrono::milliseconds(static_cast<int64_t>(value));
  }
  void sleep_ms(double value) const { std::this_thread::sleep_for(to_ms(value)); }

  // Waits for the trainer to fail; judges its error against the fault and `budget_ms`.
  void observe_trainer(FaultOutcome& out, Clock::time_point t0, double budget_ms) {
    out.budget_ms = budget_ms;
    ChildProcess& trainer = *cluster_->trainer();
    const auto hang =
        t0 + to_ms(budget_ms + std::max(10000.0, 2 * ms(options_.cluster.step_timeout)));
    // A fault that may be absorbed is, once the trainer has trained 3 more steps.
    const bool may_pass = !out.error_expected || out.fault.kind == FaultKind::Flip ||
                          out.fault.kind == FaultKind::FlipData;
    const int64_t passed = std::max<int64_t>(cluster_->step(), 0) + 3;
    while (trainer.running()) {
      if (may_pass && cluster_->step() >= passed) break;
      if (Clock::now() > hang) {
        out.failures.push_back("HANG: the trainer neither failed nor trained for " +
                               std::to_string(static_cast<int>(ms_since(t0))) + " ms");
        trainer.kill();
        return;
      }
      sleep_ms(2);
    }
    if (trainer.running() || trainer.exit_status() == 0) {
      out.error =
          trainer.running() ? "(no error: training went on)" : "(no error: the run finished)";
      if (out.error_expected && out.fault.kind != FaultKind::Flip &&
          out.fault.kind != FaultKind::FlipData && trainer.running()) {
        out.failures.push_back("no error, though the fault should have caused one");
      }
      if (!out.error_expected && !trainer.running() && trainer.exit_status() != 0) {
        out.failures.push_back("an error, though the fault should have been absorbed");
      }
      return;
    }
    out.errored = true;
    out.ms_to_error = ms_since(t0);
    out.error = cluster_->trainer_error();
    const Fault& f = out.fault;
    out.named = f.kind == FaultKind::DiskFull
                    ? out.error.find(checkpoints_->path()) != std::string::npos
                    : out.error.find(cluster_->endpoint(f.worker)) != std::string::npos ||
                          out.error.find("stage " + std::to_string(f.worker)) != std::string::npos;
    if (!out.error_expected)
      out.failures.push_back("an error, though the fault should have been absorbed");
    if (out.error_expected && !out.named && f.kind != FaultKind::Flip &&
        f.kind != FaultKind::FlipData) {
      out.failures.push_back("the error does not name the " +
                             std::string(f.kind == FaultKind::DiskFull ? "file" : "peer"));
    }
    if (out.ms_to_error > budget_ms) out.failures.push_back("the error came after the budget");
  }

  // Waits for the workers that served the killed or stopped trainer to notice and to go back
  // to waiting; judges their words and time.
  void observe_workers(FaultOutcome& out, WorkerWatch& workers, Clock::time_point t0,
                       double budget_ms) {
    out.budget_ms = budget_ms;
    const auto hang = t0 + to_ms(budget_ms) + std::chrono::seconds(10);
    const WorkerWatch::Result result = workers.wait(hang);
    if (!result.any_serving) {
      out.error = "(no worker was serving the trainer yet)";
      return;
    }
    out.errored = result.all_released;
    out.ms_to_error = std::chrono::duration<double, std::milli>(result.last_release - t0).count();
    out.error = result.words;
    out.named = result.all_named;
    if (!result.all_released) out.failures.push_back("HANG: " + result.missing);
    if (!out.named) out.failures.push_back("a worker's log does not name the coordinator");
    if (out.errored && out.ms_to_error > budget_ms) {
      out.failures.push_back("a worker noticed after the budget");
    }
  }

  void wait_released(Clock::time_point deadline) {
    for (int i = 0; i < cluster_->size(); ++i) {
      while (cluster_->worker(i).running() && !WorkerWatch::unclaimed(*cluster_, i) &&
             Clock::now() < deadline) {
        sleep_ms(5);
      }
      if (cluster_->worker(i).running() && !WorkerWatch::unclaimed(*cluster_, i)) {
        report_.failures.push_back("worker " + std::to_string(i) +
                                   " did not go back to waiting; restarted it. Log:\n" +
                                   read_tail(cluster_->worker_log(i), 1500));
        cluster_->worker(i).kill();
      }
    }
  }

  void check_crashes(FaultOutcome& out) {
    const std::string trainer_err = cluster_->trainer_stderr();
    if (trainer_err.find("Sanitizer") != std::string::npos ||
        trainer_err.find("runtime error:") != std::string::npos) {
      out.failures.push_back("the trainer hit a sanitizer error:\n" + trainer_err);
    }
    auto status = cluster_->trainer()->exit_status();
    if (status && *status != 0 && *status != 1 && *status != 128 + SIGKILL) {
      out.failures.push_back("the trainer crashed (status " + std::to_string(*status) + "):\n" +
                             trainer_err);
    }
    for (int i = 0; i < cluster_->size(); ++i) {
      ChildProcess& worker = cluster_->worker(i);
      const std::string log = read_tail(cluster_->worker_log(i), 1 << 20);
      if (log.find("Sanitizer") != std::string::npos ||
          log.find("runtime error:") != std::string::npos) {
        out.failures.push_back("worker " + std::to_string(i) + " hit a sanitizer error:\n" +
                               read_tail(cluster_->worker_log(i)));
      }
      const auto worker_status = worker.exit_status();
      const bool ours = (out.fault.kind == FaultKind::KillWorker ||
                         out.fault.kind == FaultKind::StopWorkerKill) &&
                        i == out.fault.worker;
      if (worker_status && !(ours && *worker_status == 128 + SIGKILL)) {
        out.failures.push_back("worker " + std::to_string(i) + " died (status " +
                               std::to_string(*worker_status) + "):\n" +
                               read_tail(cluster_->worker_log(i)));
      }
    }
  }

  void check_checkpoint(FaultOutcome& out) {
    if (!checkpoints_->exists()) {
      if (last_checkpoint_step_ >= 0) out.failures.push_back("the checkpoint is gone");
      return;
    }
    try {
      const Checkpoint checkpoint = checkpoints_->latest();
      out.checkpoint_step = checkpoint.step;
      out.versus_reference = reference_.compare(checkpoint);
      if (checkpoint.step < last_checkpoint_step_) {
        out.failures.push_back("the checkpoint went back from step " +
                               std::to_string(last_checkpoint_step_));
      }
      last_checkpoint_step_ = checkpoint.step;
      if (!out.versus_reference.empty() && out.versus_reference.rfind("no reference", 0) != 0) {
        out.failures.push_back("the checkpoint differs from the reference: " +
                               out.versus_reference);
      }
    } catch (const std::exception& e) {
      out.checkpoint_loads = false;
      out.failures.push_back(std::string("the latest checkpoint does not load: ") + e.what());
    }
  }

  std::string line(const FaultOutcome& out) const {
    char head[96];
    std::snprintf(head, sizeof head, "fault %d/%d %s (%s): ", out.index, options_.faults,
                  out.fault.label().c_str(), out.fault.where().c_str());
    std::string text = head + out.detail;
    if (!out.injected) return text;
    text += "\n    -> " +
            (out.errored ? "error after " + std::to_string(static_cast<int>(out.ms_to_error)) +
                               " ms (budget " + std::to_string(static_cast<int>(out.budget_ms)) +
                               "): " + out.error.substr(0, 300)
                         : out.error);
    text += "\n    -> checkpoint step " + std::to_string(out.checkpoint_step) +
            (out.checkpoint_loads ? " loads" : " DOES NOT LOAD") + ", vs reference: " +
            (out.versus_reference.empty() ? "identical" : out.versus_reference) +
            (out.temporaries.empty() ? "" : ", temporaries left: " + out.temporaries[0]);
    for (const std::string& why : out.failures) text += "\n    FAILED: " + why;
    return text;
  }

  ChaosOptions options_;
  ChaosReport report_;
  // Destroyed in reverse: every process is killed before the tmpfs is unmounted.
  std::unique_ptr<CheckpointDir> checkpoints_;
  std::unique_ptr<CheckpointTrap> trap_;
  std::unique_ptr<Cluster> cluster_;
  Reference reference_;
  int64_t last_checkpoint_step_ = -1;
};

}  // namespace pipit::chaos

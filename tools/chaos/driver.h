#pragma once
// ChaosSession: a seeded, bounded chaos run of distributed training with checkpoints.
//   1. An uninterrupted reference run (tools/chaos/reference.h).
//   2. The same run again, with the faults of plan_faults(seed) injected one at a time at
//      their trigger points. After each: the side that should notice must report an error
//      naming the peer (stage, address) or the file within the configured timeouts; the
//      trainer is restarted with --resume and dead workers are restarted; the latest
//      checkpoint must load, never go back, and equal the reference's at its step.
//   3. The final checkpoint must equal the reference's bit for bit.
// Every wait has a deadline; the Cluster kills every process when the session ends.
#include <algorithm>
#include <csignal>
#include <optional>

#include "tools/chaos/checks.h"

namespace pipit::chaos {

class ChaosSession : private ChaosChecks {
 public:
  explicit ChaosSession(ChaosOptions options) : ChaosChecks(std::move(options)) {
    for (const std::string& arg :
         {std::string("--steps"), std::to_string(options_.steps), std::string("--checkpoint-every"),
          std::to_string(options_.checkpoint_every)}) {
      options_.cluster.trainer_args.push_back(arg);
    }
  }

  ChaosReport run() {
    const auto start = Clock::now();
    deadline_ = start + options_.max_duration;
    report_.seed = options_.seed;
    cluster_ = std::make_unique<Cluster>(options_.cluster);
    const std::string& dir = options_.cluster.dir;
    reference_ = run_reference(*cluster_, dir, options_.steps, deadline_);
    log("reference: " + std::to_string(reference_.checkpoints.size()) + " checkpoints, start-up " +
        std::to_string(static_cast<int>(reference_.startup_ms)) + " ms, " +
        std::to_string(reference_.step_ms) + " ms per step");
    checkpoints_ = std::make_unique<CheckpointDir>(dir + "/checkpoints", options_.tmpfs_bytes);
    std::vector<FaultKind> kinds = options_.kinds;
    if (!checkpoints_->can_fill() && std::erase(kinds, FaultKind::DiskFull) > 0) {
      report_.notes.push_back("disk-full SKIPPED: " + checkpoints_->why_not());
      log("NOTE: " + report_.notes.back());
    }
    trap_ = std::make_unique<CheckpointTrap>(checkpoints_->path());
    start_trainer();
    const std::vector<Fault> plan =
        plan_faults(options_.seed, options_.faults, kinds, cluster_->size(),
                    static_cast<int>(options_.checkpoint_every), options_.flip_regions);
    for (size_t i = 0; i < plan.size() && Clock::now() < deadline_; ++i) {
      FaultOutcome& out = report_.faults.emplace_back();
      out.index = static_cast<int>(i + 1);
      out.fault = plan[i];
      if (!ensure_trainer() || !wait_trigger(out)) {
        out.detail = cluster_->trainer()->running() ? "not injected: its moment did not come"
                                                    : "not injected: the run had finished";
        watch_.reset();
        log(line(out));
        continue;
      }
      inject(out);
      recover(out);
      log(line(out));
    }
    finish();
    cluster_.reset();  // every process is gone before the tmpfs is unmounted
    trap_.reset();
    checkpoints_.reset();
    report_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return report_;
  }

 private:
  void start_trainer() {
    const bool resume = checkpoints_->exists();
    cluster_->start_trainer(checkpoints_->path(), resume, "trainer." + std::to_string(runs_++));
    trap_->disarm();
  }

  // The trainer is running, restarted if it stopped with an error; false once it has
  // finished the run.
  bool ensure_trainer() {
    ChildProcess* trainer = cluster_->trainer();
    if (trainer->running()) return true;
    if (trainer->exit_status() == 0) return false;
    report_.failures.push_back("the trainer failed with no fault injected: " +
                               cluster_->trainer_error());
    if (++unprovoked_ > 3) throw Error("chaos: the trainer keeps failing on its own; giving up");
    wait_released(Clock::now() + release_time());
    start_trainer();
    return true;
  }

  // How long a worker may take to end a run whose coordinator is gone: a peer timeout to
  // notice it, or a package timeout when it was claimed and left without a package, or its
  // connect timeout when it was waiting for a neighbour (then it notices nothing else).
  std::chrono::milliseconds release_time() const {
    return to_ms(std::max({ms(options_.cluster.peer_timeout) * 2,
                           ms(options_.cluster.package_timeout),
                           ms(options_.cluster.connect_timeout)})) +
           options_.slack;
  }

  bool wait_trigger(FaultOutcome& out) {
    const Fault& f = out.fault;
    ChildProcess& trainer = *cluster_->trainer();
    const auto give_up = Clock::now() +
                         to_ms(ms(options_.cluster.step_timeout) * 2 +
                               reference_.step_ms * 4 * options_.checkpoint_every) +
                         options_.slack + std::chrono::seconds(10);
    const int64_t base =
        cluster_->step() >= 0 ? cluster_->step() : std::max<int64_t>(last_checkpoint_step_, 0);
    if (f.trigger == Trigger::OnCheckpointWrite) {
      // Once the trainer trains, every worker serves it: the watch sees them all end the run.
      while (cluster_->step() <= base && trainer.running() && Clock::now() < give_up) sleep_ms(1);
      watch_.emplace(*cluster_);
      trap_->arm(trainer.pid(), f.kind == FaultKind::KillCoordinatorCheckpoint ? SIGKILL : SIGSTOP);
      while (!trap_->sprung() && trainer.running() && Clock::now() < give_up) sleep_ms(1);
      trap_->disarm();
      return trap_->sprung().has_value();
    }
    if (f.trigger == Trigger::AfterStart) {
      // The reference's start-up time is only a guide (a loaded machine can take ten times
      // longer once than the next time): a fault meant for start-up strikes no later than the
      // first step, so it never lands after a short run has finished.
      const auto at = std::max(
          Clock::now(), cluster_->trainer_started() + to_ms(f.delay * reference_.startup_ms));
      while (Clock::now() < at && cluster_->step() < 0 && trainer.running()) sleep_ms(1);
      return trainer.running();
    }
    const int64_t target = std::min(base + f.ahead, options_.steps);
    while (cluster_->step() < target && trainer.running() && Clock::now() < give_up) sleep_ms(1);
    sleep_ms(f.delay * reference_.step_ms);
    return trainer.running() && cluster_->step() >= target;
  }

  void inject(FaultOutcome& out) {
    const Fault& f = out.fault;
    out.injected = true;
    const double peer = ms(options_.cluster.peer_timeout), beat = ms(options_.cluster.heartbeat);
    const double slack = ms(options_.slack), step_timeout = ms(options_.cluster.step_timeout);
    ChildProcess& worker = cluster_->worker(f.worker);
    ChildProcess& trainer = *cluster_->trainer();
    at_fault_ = cluster_->step();
    const std::string at_step = " at step " + std::to_string(at_fault_);
    const double startup_extra =
        f.trigger == Trigger::AfterStart ? ms(options_.cluster.connect_timeout) : 0;
    if (!watch_) watch_.emplace(*cluster_);
    auto t0 = Clock::now();
    switch (f.kind) {
      case FaultKind::KillWorker:
        worker.signal(SIGKILL);
        out.detail = "SIGKILL worker " + std::to_string(f.worker) + at_step;
        observe_trainer(out, t0, peer + slack + startup_extra);
        break;
      case FaultKind::StopWorkerBrief:
        worker.signal(SIGSTOP);
        sleep_ms(peer / 4);
        worker.signal(SIGCONT);
        out.detail = "SIGSTOP worker " + std::to_string(f.worker) + at_step + " for " +
                     std::to_string(static_cast<int>(peer / 4)) + " ms, then SIGCONT";
        out.error_expected = false;
        observe_trainer(out, t0, peer + slack);
        break;
      case FaultKind::StopWorkerCont:
      case FaultKind::StopWorkerKill: {
        worker.signal(SIGSTOP);
        observe_trainer(out, t0, peer + beat + slack);
        const bool kill = f.kind == FaultKind::StopWorkerKill;
        worker.signal(kill ? SIGKILL : SIGCONT);
        out.detail = "SIGSTOP worker " + std::to_string(f.worker) + at_step + ", then " +
                     (kill ? "SIGKILL" : "SIGCONT") + " after the trainer's error";
        break;
      }
      case FaultKind::KillCoordinator:
        trainer.signal(SIGKILL);
        out.detail = "SIGKILL the trainer" + at_step;
        observe_workers(out, *watch_, t0, peer + slack);
        break;
      case FaultKind::StopCoordinatorKill:
        trainer.signal(SIGSTOP);
        observe_workers(out, *watch_, t0, peer + beat + slack);
        trainer.signal(SIGKILL);
        out.detail = "SIGSTOP the trainer" + at_step + ", then SIGKILL once the workers noticed";
        break;
      case FaultKind::KillCoordinatorCheckpoint:
      case FaultKind::StopCoordinatorCheckpoint: {
        t0 = trap_->sprung()->when;
        const bool stop = f.kind == FaultKind::StopCoordinatorCheckpoint;
        if (!stop) trainer.wait_exit(Clock::now() + std::chrono::seconds(10));
        observe_workers(out, *watch_, t0, peer + (stop ? beat : 0) + slack);
        const std::string file = trap_->sprung()->file;
        const bool mid_write = std::filesystem::exists(checkpoints_->path() + "/" + file);
        out.detail =
            std::string(stop ? "SIGSTOP" : "SIGKILL") + " the trainer" + at_step + " on creating " +
            file +
            (mid_write ? ": mid-write (the temporary remained)" : ": the write had completed");
        if (stop) {
          const auto resumed = Clock::now();
          trainer.signal(SIGCONT);
          const bool exited = trainer.wait_exit(resumed + to_ms(step_timeout + slack));
          out.detail += "; after SIGCONT the trainer " +
                        (!exited ? std::string("did not exit")
                         : trainer.exit_status() == 0
                             ? std::string("finished (exit 0)")
                             : "failed in " + std::to_string(static_cast<int>(ms_since(resumed))) +
                                   " ms: " + cluster_->trainer_error());
          if (!exited) out.failures.push_back("the trainer did not exit after SIGCONT");
        }
        break;
      }
      case FaultKind::Cut:
      case FaultKind::Flip:
      case FaultKind::FlipData:
      case FaultKind::Stall: {
        FaultProxy& proxy = *cluster_->proxy(f.worker);
        ProxyFault fault = f.proxy;
        fault.stall = to_ms(peer * 1.5 + beat);
        proxy.arm(fault);
        const auto give_up = t0 + to_ms(step_timeout) + options_.slack;
        while (!proxy.fired_since(t0) && trainer.running() && Clock::now() < give_up) sleep_ms(1);
        proxy.disarm();
        if (!proxy.fired_since(t0)) {
          out.injected = false;
          out.detail = "not injected: no such byte passed the proxy";
          return;
        }
        t0 = proxy.fired_since(t0)->when;
        at_fault_ = cluster_->step();
        out.detail = "proxy of worker " + std::to_string(f.worker) + " at step " +
                     std::to_string(at_fault_) + ": " + proxy.fired_since(t0)->what;
        const double budget = f.kind == FaultKind::Cut     ? peer + slack + startup_extra
                              : f.kind == FaultKind::Stall ? peer + beat + slack
                                                           : step_timeout + slack + startup_extra;
        observe_trainer(out, t0, budget);
        break;
      }
      case FaultKind::DiskFull: {
        const size_t bytes = checkpoints_->fill();
        out.detail =
            "filled the checkpoint tmpfs" + at_step + " (" + std::to_string(bytes) + " bytes)";
        observe_trainer(out, t0,
                        step_timeout + slack + reference_.step_ms * 4 * options_.checkpoint_every);
        checkpoints_->unfill();
        break;
      }
    }
  }

  // Restarts what the fault left dead and checks the checkpoint directory.
  void recover(FaultOutcome& out) {
    watch_.reset();
    ChildProcess& trainer = *cluster_->trainer();
    for (int i = 0; i < cluster_->size(); ++i) cluster_->worker(i).signal(SIGCONT);
    if (trainer.running() && out.errored) trainer.kill();
    if (!trainer.running()) {
      const auto released = Clock::now();
      wait_released(released + release_time());
      out.detail += "; workers free again after " +
                    std::to_string(static_cast<int>(ms_since(released))) + " ms";
    }
    check_crashes(out);
    for (int i = 0; i < cluster_->size(); ++i) {
      if (!cluster_->worker(i).running()) cluster_->start_worker(i);
    }
    if (!trainer.running()) {
      // What a killed writer left; an operator would delete it, and so does the driver.
      out.temporaries = checkpoints_->temporaries();
      checkpoints_->remove_temporaries();
    } else {
      // The trainer went on: judge the checkpoint there now (a State frame hit on its way to
      // it would show), then the first one written after the fault.
      check_checkpoint(out);
      if (!out.failures.empty()) return;
      const int64_t every = options_.checkpoint_every, after = (at_fault_ / every + 1) * every;
      const auto give_up =
          Clock::now() + to_ms(reference_.step_ms * 4 * static_cast<double>(every) +
                               ms(options_.cluster.step_timeout));
      while (trainer.running() && cluster_->step() <= after && Clock::now() < give_up) sleep_ms(2);
    }
    check_checkpoint(out);
    if (!trainer.running() && trainer.exit_status() != 0) start_trainer();
  }

  // Lets the run finish after the last fault, and compares its final checkpoint.
  void finish() {
    const auto give_up = std::min(
        deadline_, Clock::now() + std::chrono::seconds(120) +
                       to_ms(reference_.step_ms * 10 * static_cast<double>(options_.steps)));
    while (Clock::now() < give_up) {
      if (!ensure_trainer()) break;
      sleep_ms(5);
    }
    if (cluster_->trainer()->running()) {
      report_.failures.push_back("the run did not finish in time");
      return;
    }
    try {
      report_.final_versus_reference =
          compare_checkpoints(checkpoints_->latest(), reference_.final_checkpoint);
    } catch (const std::exception& e) {
      report_.final_versus_reference = std::string("does not load: ") + e.what();
    }
    if (!report_.final_versus_reference.empty()) {
      report_.failures.push_back("the final checkpoint differs from the reference: " +
                                 report_.final_versus_reference);
    }
  }

  Clock::time_point deadline_;
  std::optional<WorkerWatch> watch_;  // the workers as the current fault struck
  int64_t at_fault_ = 0;
  int runs_ = 0, unprovoked_ = 0;
};

}  // namespace pipit::chaos

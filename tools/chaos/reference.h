#pragma once
// The uninterrupted run a chaos session is judged against: the same trainer and workers
// without faults. A DirWatch keeps a hard link to every checkpoint it writes (taken the
// moment the rename lands, named by the step inside), so a checkpoint the chaos run leaves
// after a fault can be compared with the reference at the same step. Also times the run:
// start-up (start to first step) and one step, which place the faults.
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "tools/chaos/checkpoint_dir.h"
#include "tools/chaos/cluster.h"
#include "tools/chaos/dir_watch.h"

namespace pipit::chaos {

struct Reference {
  std::map<int64_t, std::string> checkpoints;  // step -> a file holding that checkpoint
  Checkpoint final_checkpoint;
  double startup_ms = 0, step_ms = 0;

  // "" when `checkpoint` equals the reference's at its step, else the difference.
  std::string compare(const Checkpoint& checkpoint) const {
    auto it = checkpoints.find(checkpoint.step);
    if (it == checkpoints.end()) return "no reference at step " + std::to_string(checkpoint.step);
    return compare_checkpoints(checkpoint, load_checkpoint(it->second));
  }
};

inline Reference run_reference(Cluster& cluster, const std::string& dir, int64_t steps,
                               Clock::time_point deadline) {
  namespace fs = std::filesystem;
  const std::string checkpoint_dir = dir + "/reference", snapshots = dir + "/reference-steps";
  fs::create_directories(checkpoint_dir);
  fs::create_directories(snapshots);
  Reference reference;
  std::mutex mutex;
  int links = 0;
  {
    DirWatch watch(checkpoint_dir, [&](const std::string& name, uint32_t mask) {
      if (!(mask & IN_MOVED_TO) || name != CheckpointDir::kFile) return;
      const std::string link = snapshots + "/" + std::to_string(links++);
      std::error_code ec;
      fs::create_hard_link(checkpoint_dir + "/" + name, link, ec);
      if (ec) return;
      try {
        const int64_t step = load_checkpoint(link).step;
        const std::string named = snapshots + "/step" + std::to_string(step) + ".safetensors";
        fs::rename(link, named);
        std::lock_guard<std::mutex> lock(mutex);
        reference.checkpoints[step] = named;
      } catch (const std::exception&) {
        // Not a checkpoint we can use as a reference: that step goes without one.
      }
    });
    cluster.start_trainer(checkpoint_dir, false, "reference");
    const Clock::time_point start = cluster.trainer_started();
    Clock::time_point first_step{};
    while (cluster.trainer()->running()) {
      PIPIT_CHECK(Clock::now() < deadline, "chaos: the reference run did not finish in time");
      if (first_step == Clock::time_point{} && cluster.step() >= 1) first_step = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    cluster.step();
    PIPIT_CHECK(cluster.trainer()->exit_status() == 0 && cluster.step() == steps,
                "chaos: the reference run failed:\n", cluster.trainer_stderr());
    const auto end = Clock::now();
    if (first_step == Clock::time_point{}) first_step = end;
    reference.startup_ms = std::chrono::duration<double, std::milli>(first_step - start).count();
    reference.step_ms = std::chrono::duration<double, std::milli>(end - first_step).count() /
                        static_cast<double>(std::max<int64_t>(1, steps - 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the last rename's event
  }
  reference.final_checkpoint = load_checkpoint(checkpoint_dir + "/" + CheckpointDir::kFile);
  return reference;
}

}  // namespace pipit::chaos

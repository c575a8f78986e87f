#pragma once
// ParameterServer: one shard of a data-parallel run's parameters and their optimizer,
// serving PsWorkers through a Communicator (ps/config.h numbers the endpoints).
//
// Every worker joins, then repeatedly pushes a gradient computed from the parameters it
// last read and waits for this shard's parameters in reply. By mode:
//  - sync: an update waits for one push from every live worker at the current version, sums
//    them in worker order and steps; everyone gets the new parameters. Workers scale their
//    loss gradients by 1 / workers, so the sum is the large batch's mean gradient computed
//    as sequential accumulation: on the CPU the run equals that, bit for bit.
//  - async (AsySG-InCon): each push is summed as it arrives; every `accumulate` pushes make
//    an update; the pusher gets the parameters as they are then. Shards update on their own,
//    so a worker's read of the whole model mixes versions (inconsistent reads).
//  - bounded: as async, but a worker gets its reply only while it is at most max_staleness
//    steps ahead of the slowest live worker (StalenessGate: stale synchronous parallel); the
//    others' replies wait until the slowest catches up. Any number of shards.
// A worker's push may come in parts (PsPush::last). A push that names unknown parameters or
// one twice, has the wrong shapes or dtypes, or claims a version the shard has not reached is
// refused with a logged reason and a PsError to its worker;
// nothing of it is applied and the worker is dropped from the run.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/control.h"
#include "optim/optimizer.h"
#include "ps/config.h"
#include "ps/messages.h"
#include "ps/staleness_gate.h"

namespace pipit {

struct PsServerStats {
  int64_t version = 0;                   // updates applied
  int64_t gradients = 0;                 // pushes summed into updates
  int64_t parts = 0;                     // push messages (a push may come in parts)
  int64_t refused = 0;                   // pushes refused
  int64_t pushed_bytes = 0;              // tensor bytes of the pushes received
  double busy_ms = 0;                    // handling messages, not waiting for them
  std::map<int64_t, int64_t> staleness;  // staleness -> gradients
  std::map<int64_t, int64_t> lead;       // steps ahead of the slowest worker -> reads granted
  std::vector<int> lost;                 // workers lost during the run
};

class ParameterServer {
 public:
  // `parameters`: this shard's, owned by the server from now on.
  ParameterServer(std::shared_ptr<Communicator> comm, NamedParameters parameters, PsConfig config,
                  int shard);
  ~ParameterServer();

  // Serves until every worker has left or been lost. Throws an Error naming the worker when
  // a sync run loses more workers than min_workers allows (after telling the others), and
  // an Error naming the wait when no message arrives within config.timeout.
  void serve();

  // Resumes from a checkpoint: parameters, optimizer state and version.
  void load(const StateDict& weights, const StateDict& optimizer_state, int64_t version);
  StateDict weights() const;
  StateDict optimizer_state() const;
  const PsServerStats& stats() const { return stats_; }
  int shard() const { return shard_; }
  const PsConfig& config() const { return config_; }

  // Called after every update (for checkpoints), on the serving thread.
  std::function<void(const ParameterServer&)> after_update;
  // One line per event (a refused push, a lost worker); default: stderr.
  std::function<void(const std::string&)> log;

 private:
  struct Push {
    int worker = 0;
    int64_t version = 0;
    std::vector<Tensor> gradients;  // per shard parameter; undefined where none was pushed
  };

  // No message within config.timeout: an Error naming the workers still awaited.
  [[noreturn]] void silent() const;
  void lost(const PeerLost& lost);
  // A Join, Push or Leave of a live worker.
  void handle(int worker, Message& message);
  void on_join(int worker);
  void on_push(int worker, Message& message);
  void on_gone(int worker, const std::string& why);
  // A part of `worker`'s push for this step, checked and kept; the whole push once its last
  // part is in, nothing before (or when refused).
  std::optional<Push> decode_push(int worker, Message& message);
  bool first_part_allowed(int worker, const PsPush& meta);
  void refuse(int worker, const std::string& why);
  void try_sync_update();
  void grant_reads();  // async and bounded: send the parameters to those the gate lets read
  void add(const Push& push);
  void update();
  void send_parameters(int worker);
  void say(const std::string& line) const;
  int worker_of(int endpoint) const;
  std::string who(int worker) const;

  std::shared_ptr<Communicator> comm_;
  NamedParameters parameters_;
  PsConfig config_;
  int shard_;
  std::unique_ptr<Optimizer> optimizer_;
  StalenessGate gate_;
  PsServerStats stats_;
  std::vector<bool> live_, joined_;
  std::map<std::string, size_t> index_;  // parameter name -> its place in parameters_
  std::map<int, Push> parts_;            // pushes whose last part has not come, by worker
  std::map<int, Push> sync_pushes_;      // sync: this version's, by worker
  std::vector<int> waiting_reads_;       // async and bounded: workers owed parameters, in order
  std::vector<int64_t> read_;  // per worker: the version it read and owes a push for, or -1
  std::vector<Tensor> sums_;   // the next update's gradients, owned by the server
  int64_t summed_ = 0;
  std::vector<Tensor> snapshot_;  // the parameters at snapshot_version_, as sent to workers
  int64_t snapshot_version_ = -1;
};

}  // namespace pipit

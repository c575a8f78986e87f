#pragma once
// StageRemap: the part of a Stage (pipeline/stage.h) that moves layers between stages between
// steps (Coordinator::remap). On RemapPrepare the stage sends the layers it gives up to their
// new stages and collects those it receives (layer_migration.h), aside from the chunks it
// trains; it answers RemapReady once every layer is here, and on RemapCommit trains the new
// chunks with their optimizer state. With the optimizer sharded (ZeRO-1) the replicas of the
// stage first pool their shares of its state (State messages between the members), so that
// moved layers carry all of theirs; the new chunks' state is shared out anew.
#include <memory>
#include <optional>

#include "pipeline/rebalancing/layer_migration.h"

namespace pipit {

class Stage;

class StageRemap {
 public:
  // Registers the handlers of the remap's messages.
  explicit StageRemap(Stage& stage);
  void reset();

 private:
  bool prepare(Message message);
  bool receive_layers(Message message);
  bool receive_share(Message message);
  bool commit(Message message);
  void pool(const Message& share);
  void start_migration();
  void advance();

  Stage& stage_;
  // Before the migration starts under ZeRO-1: its RemapPrepare, the state pooled so far and
  // the members' shares still to come.
  std::optional<Message> prepare_;
  StateDict pooled_state_;
  int shares_awaited_ = 0;
  std::unique_ptr<LayerMigration> migration_;
  std::optional<LayerMigration::Result> staged_;
};

}  // namespace pipit

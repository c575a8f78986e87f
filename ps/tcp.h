#pragma once
// Parameter-server endpoints over TCP: a shard listens, each worker connects to every
// shard. A shard admits only this run's workers (ids servers .. servers + workers - 1); the
// handshake, token and heartbeats are TcpCommunicator's, as for pipeline workers.
#include <memory>
#include <string>
#include <vector>

#include "comm/tcp_communicator.h"
#include "ps/config.h"

namespace pipit {

// Shard `shard`'s communicator, listening on `listen` ("host:port"; port 0: any free one,
// returned through bound_port).
std::shared_ptr<TcpCommunicator> listen_as_ps_shard(const PsConfig& config, int shard,
                                                    const std::string& listen, TcpOptions tcp,
                                                    uint16_t* bound_port = nullptr);

// Connects `comm` (worker `worker`'s endpoint) to every shard at `shards`, in shard order;
// errors name the shard and address.
void connect_to_ps_shards(TcpCommunicator& comm, const PsConfig& config, int worker,
                          const std::vector<std::string>& shards);

// Worker `worker`'s communicator, connected to every shard; `shards` holds their "host:port"
// in shard order. Errors name the shard and address.
std::shared_ptr<TcpCommunicator> connect_as_ps_worker(const PsConfig& config, int worker,
                                                      const std::vector<std::string>& shards,
                                                      TcpOptions tcp);

}  // namespace pipit

#include "ps/tcp.h"

namespace pipit {

std::shared_ptr<TcpCommunicator> listen_as_ps_shard(const PsConfig& config, int shard,
                                                    const std::string& listen, TcpOptions tcp,
                                                    uint16_t* bound_port) {
  validate(config);
  const int first = config.worker_id(0), last = config.worker_id(config.workers - 1);
  tcp.admit = [first, last](int peer, const std::string&) -> std::string {
    if (peer >= first && peer <= last) return "";
    return "endpoint " + std::to_string(peer) + " is no worker of this parameter-server run";
  };
  auto comm = std::make_shared<TcpCommunicator>(config.server_id(shard), std::move(tcp));
  const auto [host, port] = parse_endpoint(listen);
  const uint16_t bound = comm->listen(host, port);
  if (bound_port) *bound_port = bound;
  return comm;
}

void connect_to_ps_shards(TcpCommunicator& comm, const PsConfig& config, int worker,
                          const std::vector<std::string>& shards) {
  PIPIT_CHECK(static_cast<int>(shards.size()) == config.servers, "parameter-server worker ", worker,
              ": ", shards.size(), " shard addresses for ", config.servers, " shards");
  for (int s = 0; s < config.servers; ++s) {
    const std::string& address = shards[static_cast<size_t>(s)];
    try {
      const auto [host, port] = parse_endpoint(address);
      comm.connect(config.server_id(s), host, port);
    } catch (const Error& e) {
      throw Error(detail::concat("parameter-server worker ", worker, ": cannot reach shard ", s,
                                 " at ", address, ": ", e.what()));
    }
  }
}

std::shared_ptr<TcpCommunicator> connect_as_ps_worker(const PsConfig& config, int worker,
                                                      const std::vector<std::string>& shards,
                                                      TcpOptions tcp) {
  validate(config);
  auto comm = std::make_shared<TcpCommunicator>(config.worker_id(worker), std::move(tcp));
  connect_to_ps_shards(*comm, config, worker, shards);
  return comm;
}

}  // namespace pipit

// TcpCommunicator against hostile and unlucky peers: nothing a peer sends before it proves
// the token costs more than a handshake's bytes or ends the io thread, pending connections
// are capped and timed out, a flood of idle connections cannot keep a real peer out, and a
// large frame arriving slowly but steadily stays alive.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include "comm/asio.h"

#include "codec/atomic_file.h"
#include "comm/frame.h"
#include "comm/handshake.h"
#include "comm/tcp_communicator.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/remote/host.h"
#include "pipit.h"
#include "support/connection_flood.h"

using namespace pipit;
using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

// Collects a communicator's log lines.
struct Log {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
  }
  bool contains(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
  // Waits up to `timeout` for a line containing `text`.
  bool wait_for(const std::string& text, std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (contains(text)) return true;
      std::this_thread::sleep_for(5ms);
    }
    return contains(text);
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string out;
    for (const auto& line : lines) out += line + "\n";
    return out;
  }
};

// A raw TCP client that sends whatever bytes a test wants.
struct RawPeer {
  asio::io_context io;
  tcp::socket socket{io};
  explicit RawPeer(uint16_t port) { socket.connect({asio::ip::make_address("127.0.0.1"), port}); }
  void send(const std::string& bytes) { asio::write(socket, asio::buffer(bytes)); }
  // Reads until the other side closes or `timeout` passes; true when it closed.
  bool closed_within(std::chrono::milliseconds timeout) {
    socket.non_blocking(true);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char sink[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      asio::error_code ec;
      socket.read_some(asio::buffer(sink), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(2ms);
      } else if (ec) {
        return true;
      }
    }
    return false;
  }
};

std::string hello_frame(nlohmann::json meta) {
  Message hello(MessageKind::Hello, 0);
  hello.meta = std::move(meta);
  return encode_frame(hello);
}

// Forwards one connection from a local port to `target`, passing at most `bytes_per_tick`
// bytes every `tick` from client to server (the other way unthrottled).
class ThrottlingProxy {
 public:
  ThrottlingProxy(uint16_t target, size_t bytes_per_tick, std::chrono::milliseconds tick)
      : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, target, bytes_per_tick, tick] {
      tcp::socket client(io_), server(io_);
      acceptor_.accept(client);
      server.connect({asio::ip::make_address("127.0.0.1"), target});
      std::thread back([&] { pump(server, client, 1 << 16, 0ms); });
      pump(client, server, bytes_per_tick, tick);
      back.join();
    });
  }
  ~ThrottlingProxy() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  void pump(tcp::socket& from, tcp::socket& to, size_t chunk, std::chrono::milliseconds tick) {
    std::vector<char> buffer(chunk);
    from.non_blocking(true);
    while (!stop_) {
      asio::error_code ec;
      const size_t n = from.read_some(asio::buffer(buffer), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(1ms);
        continue;
      }
      if (ec) break;
      asio::write(to, asio::buffer(buffer.data(), n), ec);
      if (ec) break;
      if (tick.count() > 0) std::this_thread::sleep_for(tick);
    }
    asio::error_code ignored;
    to.shutdown(tcp::socket::shutdown_both, ignored);
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TcpOptions options_with(Log& log) {
  TcpOptions options;
  options.log = log.sink();
  return options;
}

// Connects a fresh endpoint to `server` as peer 0 and checks a message gets through.
void check_still_serving(TcpCommunicator& server, uint16_t port, const std::string& token = "") {
  TcpOptions options;
  options.token = token;
  options.log = [](const std::string&) {};
  TcpCommunicator client(7, options);
  client.connect(0, "127.0.0.1", port);
  client.send(0, Message(MessageKind::Ready, 42));
  std::optional<Message> got = server.try_receive(5000ms);
  REQUIRE(got.has_value());
  CHECK(got->kind == MessageKind::Ready);
  CHECK(got->step == 42);
  CHECK(got->from == 7);
}

}  // namespace

TEST_CASE("a malformed Hello from an unauthenticated peer closes only its connection", "[tcp]") {
  Log log;
  TcpOptions options = options_with(log);
  options.token = "sesame";
  TcpCommunicator server(0, options);
  const uint16_t port = server.listen("127.0.0.1", 0);
  // Each once escaped the handshake as a JSON library exception and ended the process.
  const std::vector<nlohmann::json> hellos = {
      {{"version", kProtocolVersion}, {"id", 1}, {"nonce", "n"}, {"session", 5}},
      {{"version", kProtocolVersion}, {"id", 1}, {"nonce", "n"}, {"session", {1, 2}}},
      {{"version", "1"}, {"id", 1}, {"nonce", "n"}, {"session", ""}},
      {{"version", kProtocolVersion}, {"id", 1.5}, {"nonce", "n"}, {"session", ""}},
      nlohmann::json::array({1, 2, 3}),
      {{"proof", {{"nested", true}}}}};
  for (const auto& meta : hellos) {
    RawPeer peer(port);
    peer.send(hello_frame(meta));
    CHECK(peer.closed_within(5000ms));
  }
  CHECK(log.contains("Hello frame field \"session\" is number, not a string"));
  check_still_serving(server, port, "sesame");
}

TEST_CASE("before authentication a peer can send no body and only a small header", "[tcp]") {
  Log log;
  TcpOptions options = options_with(log);
  options.token = "sesame";
  TcpCommunicator server(0, options);
  const uint16_t port = server.listen("127.0.0.1", 0);

  // A Hello announcing a 64 MiB body: refused from the fixed header, nothing allocated.
  std::string big_body = hello_frame({{"version", kProtocolVersion}});
  const uint64_t body = 64ull << 20;
  for (int i = 0; i < 8; ++i) big_body[16 + i] = static_cast<char>((body >> (8 * i)) & 0xff);
  RawPeer first(port);
  first.send(big_body.substr(0, kFrameHeaderSize));
  CHECK(first.closed_within(5000ms));
  CHECK(log.wait_for("body_length 67108864 exceeds the limit of 0 bytes"));

  // A 100 KB JSON header: over the handshake's 4 KiB.
  std::string big_header = hello_frame({{"version", kProtocolVersion}});
  const uint32_t header = 100000;
  for (int i = 0; i < 4; ++i) big_header[8 + i] = static_cast<char>((header >> (8 * i)) & 0xff);
  RawPeer second(port);
  second.send(big_header.substr(0, kFrameHeaderSize));
  CHECK(second.closed_within(5000ms));
  CHECK(log.wait_for("header_length 100000 exceeds the limit of 4096 bytes"));

  // JSON nested past the depth limit, within the size limit.
  std::string deep(200, '[');
  deep += std::string(200, ']');
  std::string frame = hello_frame(nlohmann::json::object());
  const std::string json_header = "{\"step\":0,\"microbatch\":0,\"chunk\":0,\"meta\":" + deep + "}";
  frame = frame.substr(0, kFrameHeaderSize) + json_header;
  for (int i = 0; i < 4; ++i) {
    frame[8 + i] = static_cast<char>((json_header.size() >> (8 * i)) & 0xff);
  }
  // A correct checksum, so that the frame fails on its depth, not its bytes.
  const FrameHeader deep_header =
      decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
  const uint32_t checksum = frame_checksum(deep_header, json_header, "");
  for (int i = 0; i < 4; ++i) frame[12 + i] = static_cast<char>((checksum >> (8 * i)) & 0xff);
  RawPeer third(port);
  third.send(frame);
  CHECK(third.closed_within(5000ms));
  CHECK(log.wait_for("nests deeper than 32 levels"));
  check_still_serving(server, port, "sesame");
}

TEST_CASE("past the pending cap a newcomer takes the place of the oldest silent handshake",
          "[tcp]") {
  Log log;
  TcpOptions options = options_with(log);
  options.token = "sesame";
  options.max_pending_connections = 3;
  options.handshake_timeout = 3000ms;
  TcpCommunicator server(0, options);
  const uint16_t port = server.listen("127.0.0.1", 0);
  RawPeer first(port), second(port), spoke(port);
  // A whole Hello, then no proof: a peer that spoke keeps its place until its deadline. The
  // pause lets the server read it (a slower read could only fail this test, not pass it).
  spoke.send(encode_frame(to_message(Hello{5, random_nonce(), ""})));
  std::this_thread::sleep_for(300ms);
  RawPeer third(port), fourth(port), fifth(port);
  CHECK(first.closed_within(2000ms));
  CHECK(second.closed_within(2000ms));
  CHECK(third.closed_within(2000ms));  // the oldest silent one once fifth came
  CHECK(log.wait_for("3 closed silent to make room for newer ones, 0 refused"));
  // The others wait for their handshake deadline.
  CHECK_FALSE(spoke.closed_within(100ms));
  for (RawPeer* peer : {&spoke, &fourth, &fifth}) CHECK(peer->closed_within(6000ms));
  CHECK(log.contains("no handshake within 3000 ms"));
  check_still_serving(server, port, "sesame");
}

TEST_CASE("when every pending handshake has spoken, a newcomer is refused at once", "[tcp]") {
  Log log;
  TcpOptions options = options_with(log);
  options.token = "sesame";
  options.max_pending_connections = 2;
  TcpCommunicator server(0, options);
  const uint16_t port = server.listen("127.0.0.1", 0);
  RawPeer a(port), b(port);
  for (RawPeer* peer : {&a, &b}) peer->send(encode_frame(to_message(Hello{5, random_nonce(), ""})));
  std::this_thread::sleep_for(300ms);
  RawPeer newcomer(port);
  CHECK(newcomer.closed_within(2000ms));  // long before the 10 s handshake deadline
  CHECK(log.wait_for("0 closed silent to make room for newer ones, 1 refused"));
  CHECK_FALSE(a.closed_within(10ms));
  CHECK_FALSE(b.closed_within(10ms));
}

TEST_CASE("a renewed flood of 600 idle connections does not keep a real peer out", "[tcp]") {
  // Default options: the server holds 64 handshakes; each flood connection sends half a frame
  // header and is opened again the moment the server closes it. The peer connects with its
  // default 10 s connect timeout, which bounds the test: a server that refused newcomers
  // while the table is full let a peer in only after about 27 s.
  Log log;
  TcpCommunicator server(0, options_with(log));
  const uint16_t port = server.listen("127.0.0.1", 0);
  support::ConnectionFlood flood("127.0.0.1", port, 600, /*renew=*/true);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (flood.closed_by_peer() < 600 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(flood.closed_by_peer() >= 600);  // the table is full and the flood renews
  check_still_serving(server, port);
  INFO(log.all());
  CHECK(log.wait_for("closed silent to make room for newer ones"));
  CHECK(flood.opened() > 600);
}

TEST_CASE("a large frame arriving slowly but steadily is not cut off by the peer timeout",
          "[tcp]") {
  Log server_log, client_log;
  TcpOptions options = options_with(server_log);
  options.heartbeat_interval = 50ms;
  options.peer_timeout = 300ms;
  TcpCommunicator server(0, options);
  const uint16_t port = server.listen("127.0.0.1", 0);
  // 32 KiB every 20 ms: about 1.6 MB/s, so the 2 MiB frame takes over a second, several
  // peer timeouts, and the reader's 1 MiB low-water mark is reached only every ~0.6 s.
  ThrottlingProxy proxy(port, 32 << 10, 20ms);
  TcpOptions client_options = options_with(client_log);
  client_options.heartbeat_interval = 50ms;
  client_options.peer_timeout = 300ms;
  TcpCommunicator client(1, client_options);
  client.connect(0, "127.0.0.1", proxy.port());

  Tensor big = arange(0, 512 * 1024, 1);  // 2 MiB
  const auto start = std::chrono::steady_clock::now();
  client.send(0, Message(PipelineKind::Activation, 3, 0, 0, {big}));
  std::optional<Message> got = server.try_receive(20000ms);
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(server_log.all());
  REQUIRE(got.has_value());
  REQUIRE(got->kind == PipelineKind::Activation);
  REQUIRE(got->tensors.size() == 1);
  CHECK(std::memcmp(got->tensors[0].raw_data(), big.raw_data(), big.nbytes()) == 0);
  CHECK(took > 600ms);  // the throttle really stretched the frame over several timeouts
  CHECK_FALSE(server_log.contains("no bytes"));
}

TEST_CASE("wait_for_peer returns once the peer connected and names it after the timeout", "[tcp]") {
  Log log;
  TcpCommunicator server(0, options_with(log));
  const uint16_t port = server.listen("127.0.0.1", 0);
  CHECK_THROWS_WITH(server.wait_for_peer(5, 100ms), Catch::Contains("peer 5"));
  TcpOptions options;
  options.log = [](const std::string&) {};
  TcpCommunicator client(5, options);
  client.connect(0, "127.0.0.1", port);
  CHECK_NOTHROW(server.wait_for_peer(5, 5000ms));
}

TEST_CASE("a token others can read and a worker open beyond loopback without one are warned of",
          "[tcp]") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("pipit_token_" + std::to_string(::getpid())))
          .string();
  write_file_atomic(path, "sesame\n");
  std::vector<std::string> warnings;
  auto warn = [&warnings](const std::string& line) { warnings.push_back(line); };
  ::chmod(path.c_str(), 0644);
  CHECK(read_token_file(path, warn) == "sesame");
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0],
             Catch::Contains("can be read by other users") && Catch::Contains("chmod 600"));
  ::chmod(path.c_str(), 0600);
  warnings.clear();
  CHECK(read_token_file(path, warn) == "sesame");
  CHECK(warnings.empty());
  std::filesystem::remove(path);

  Log log;
  HostOptions options;
  options.runs = 0;  // warn, then serve no run
  options.tcp.log = log.sink();
  options.listen = "0.0.0.0:0";
  run_host(options);
  CHECK(log.contains("WITHOUT a token"));
  Log quiet;
  options.tcp.log = quiet.sink();
  options.listen = "127.0.0.1:0";
  run_host(options);
  options.listen = "0.0.0.0:0";
  options.tcp.token = "sesame";
  run_host(options);
  CHECK_FALSE(quiet.contains("WITHOUT a token"));
}

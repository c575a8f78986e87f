// A socket-level fuzzer against a live worker process: mutated frames before the handshake
// (as an unknown peer) and after it (as a coordinator that proved the token), with and
// without a token. After every round the worker must still be running, and at the end it
// must serve a real run whose loss equals the in-process one bit for bit.
// PIPIT_WORKER_FUZZ_ROUNDS sets the rounds per mode (default 40; run it longer by hand) and
// PIPIT_WORKER_FUZZ_LOG=PATH keeps the worker's log (PATH.open, PATH.token) for figures.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include "comm/asio.h"

#include "comm/frame.h"
#include "comm/handshake.h"
#include "distributed_reference.h"
#include "nn/builders.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "pipeline/remote/stage_package.h"
#include "pipeline_models.h"
#include "pipit.h"

using namespace pipit;
using asio::ip::tcp;
using pipit::testing::Batch;
using pipit::testing::test_worker;
using pipit::testing::WorkerProcess;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<Sequential> tiny_gpt() {
  Generator generator(5);
  return gpt({11, 6, 2, 2, 16, 0.0}, &generator);
}

PipelineConfig one_stage() {
  PipelineConfig config;
  config.stages = 1;
  config.microbatches = 2;
  config.optimizer = {{"type", "AdamW"}, {"lr", 0.01}};
  config.timeout = 20000ms;
  return config;
}

// Valid frames of every kind a worker may see, to mutate.
std::vector<std::string> seed_frames() {
  auto model = tiny_gpt();
  const PipelineConfig config = one_stage();
  StagePackage package = make_stage_package(*model, partition_model(*model, config), config, 0);
  std::vector<Message> messages = {
      to_message(Hello{-1, random_nonce(), "fuzz"}),
      to_message(Proof{std::string(64, 'a')}),
      to_message(Refusal{"busy"}),
      Message(PipelineKind::StepBegin, 1),
      Message(PipelineKind::Activation, 1, 0, 0, {zeros({2, 6}).to(DType::i64)}),
      Message(MessageKind::Heartbeat, 0),
      stage_package_message(package)};
  messages[3].meta = {{"train", true}, {"microbatches", 2}, {"trace", false}, {"grad_norm", false}};
  std::vector<std::string> frames;
  for (const Message& m : messages) frames.push_back(encode_frame(m));
  return frames;
}

std::string mutate(std::string frame, std::mt19937_64& rng) {
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !frame.empty(); ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        frame[pick(frame.size())] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:  // a random byte in the fixed header
        frame[pick(std::min<size_t>(frame.size(), kFrameHeaderSize))] = static_cast<char>(rng());
        break;
      case 2:  // truncate
        frame.resize(pick(frame.size()));
        break;
      case 3:  // insert random bytes
        frame.insert(pick(frame.size()), std::string(1 + pick(16), static_cast<char>(rng())));
        break;
      case 4:  // erase a span
        frame.erase(pick(frame.size()), 1 + pick(16));
        break;
      default:  // append garbage
        frame += std::string(1 + pick(64), static_cast<char>(rng()));
    }
  }
  return frame;
}

// Makes the checksum field match the (mutated) bytes again when the fixed header still
// decodes, so that mutations reach the decoders behind the checksum too.
std::string resealed(std::string frame) {
  if (frame.size() < kFrameHeaderSize) return frame;
  try {
    const FrameHeader header = decode_frame_header(reinterpret_cast<const uint8_t*>(frame.data()));
    const std::string_view rest = std::string_view(frame).substr(kFrameHeaderSize);
    if (rest.size() < header.header_length) return frame;
    const uint32_t checksum = frame_checksum(header, rest.substr(0, header.header_length),
                                             rest.substr(header.header_length));
    for (int i = 0; i < 4; ++i) frame[12 + i] = static_cast<char>((checksum >> (8 * i)) & 0xff);
  } catch (const FrameError&) {
  }
  return frame;
}

// Reads one frame from a blocking socket (small frames only: the worker's handshake).
Message read_frame(tcp::socket& socket) {
  uint8_t fixed[kFrameHeaderSize];
  asio::read(socket, asio::buffer(fixed));
  const FrameHeader header = decode_frame_header(fixed);
  std::string json(header.header_length, '\0'), body(header.body_length, '\0');
  asio::read(socket, asio::buffer(json));
  asio::read(socket, asio::buffer(body));
  return decode_frame_payload(header, json, body);
}

// Completes the handshake as a coordinator over a raw socket; false when refused.
bool handshake(tcp::socket& socket, const std::string& token, const std::string& session) {
  Handshake handshake(kCoordinator, session, token, 0);
  asio::write(socket, asio::buffer(encode_frame(handshake.hello())));
  while (handshake.state() == Handshake::State::Waiting) {
    const Handshake::Step step = handshake.on_message(read_frame(socket), nullptr);
    for (const Message& reply : step.replies)
      asio::write(socket, asio::buffer(encode_frame(reply)));
  }
  return handshake.state() == Handshake::State::Connected;
}

int rounds() {
  const char* text = std::getenv("PIPIT_WORKER_FUZZ_ROUNDS");
  return text ? std::max(1, std::atoi(text)) : 40;
}

void fuzz_worker(const std::string& token) {
  WorkerProcess worker(test_worker(token, {"--package-timeout-ms=2000"}));
  const std::vector<std::string> seeds = seed_frames();
  std::mt19937_64 rng(token.empty() ? 1 : 2);
  asio::io_context io;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), worker.port());
  int authenticated = 0;
  for (int round = 0; round < rounds(); ++round) {
    INFO("round " << round << "\n" << worker.log());
    for (const bool after_handshake : {false, true}) {
      tcp::socket socket(io);
      asio::error_code ec;
      // Between two runs the worker's listener is briefly closed: retry for a while.
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      do {
        socket.close(ec);
        socket.connect(endpoint, ec);
        if (ec) std::this_thread::sleep_for(20ms);
      } while (ec && std::chrono::steady_clock::now() < deadline);
      REQUIRE_FALSE(ec);
      if (after_handshake) {
        try {
          if (!handshake(socket, token, "fuzz-" + std::to_string(round))) continue;
        } catch (const std::exception&) {
          continue;  // the worker closed on us: it is between runs
        }
        ++authenticated;
      }
      for (int frame = 0; frame < 3; ++frame) {
        std::string bytes = mutate(seeds[rng() % seeds.size()], rng);
        if (rng() % 4 != 0) bytes = resealed(std::move(bytes));
        asio::write(socket, asio::buffer(bytes), ec);
        if (ec) break;
      }
      socket.shutdown(tcp::socket::shutdown_both, ec);
      socket.close(ec);
    }
    REQUIRE(worker.alive());
  }
  CHECK(authenticated > 0);
  // Still serving: a real coordinator trains, bit for bit as in-process.
  TcpOptions tcp;
  tcp.token = token;
  tcp.connect_timeout = 15000ms;
  tcp.log = [](const std::string&) {};
  Pipeline pipeline(tiny_gpt(), one_stage(), Launch::workers({worker.endpoint()}, tcp));
  Pipeline reference(tiny_gpt(), one_stage());
  const Batch b = testing::gpt_batch(11, 4, 6);
  INFO(worker.log());
  CHECK(pipeline.train_step(b.input, b.target) == reference.train_step(b.input, b.target));
  if (const char* path = std::getenv("PIPIT_WORKER_FUZZ_LOG")) {
    write_file_atomic(std::string(path) + (token.empty() ? ".open" : ".token"), worker.log());
  }
}

}  // namespace

TEST_CASE("a worker keeps serving after mutated frames, without a token", "[distributed][fuzz]") {
  fuzz_worker("");
}

TEST_CASE("a worker keeps serving after mutated frames, with a token", "[distributed][fuzz]") {
  fuzz_worker("sesame");
}

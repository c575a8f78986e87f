#pragma once
// The MPI half of bench/tcp_throughput. The benchmark starts itself under mpirun in a role:
//   transport (2 ranks): raw MPI_Send/MPI_Recv, then the same through MpiTransport
//             (throughput of 1-64 MiB messages, round trip of 64 bytes);
//   gpt (4 ranks):       the GPT step of bench/gpt_step.h as a Pipeline over Launch::mpi().
// Rank 0 prints "mpi-result NAME VALUE" lines, which mpi_results() collects. Raw MPI and the
// transport cannot run at once (the transport's progress thread owns MPI, and stopping it
// finalizes MPI), so one launch measures raw first, then pipit; rounds alternate by launch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/gpt_step.h"
#include "bench/results.h"
#include "pipit.h"
#ifdef PIPIT_WITH_MPI
#include <mpi.h>

#include "comm/mpi/mpi_communicator.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#endif

namespace pipit::bench {

inline const std::vector<size_t> kThroughputMiB = {1, 4, 16, 64};
constexpr int kRoundTrips = 5000;

// Messages per throughput measurement: 512 MiB in all, at least 4.
inline int message_count(size_t size) {
  return static_cast<int>(std::max<size_t>(4, (size_t{512} << 20) / size));
}

struct MpiResults {
  std::map<std::string, double> values;
  std::string failure;  // why there are none; empty when the run worked
};

// Runs this program under mpirun with `role_flags` (--mpi-role ROLE ...) on `ranks` ranks and
// collects rank 0's results.
inline MpiResults mpi_results(const std::string& role_flags, int ranks) {
  MpiResults results;
  std::string command = "timeout 300 mpirun --allow-run-as-root --oversubscribe -np ";
  command += std::to_string(ranks);
  command += " ";
  command += std::filesystem::read_symlink("/proc/self/exe").string();
  command += " ";
  command += role_flags;
  command += " 2>&1";
  const CommandOutput run = command_output(command);
  std::string output;
  for (const std::string& line : run.lines) {
    std::istringstream fields(line);
    std::string tag, name;
    double value = 0;
    if (fields >> tag >> name >> value && tag == "mpi-result") {
      results.values[name] = value;
    } else {
      output += line;
    }
  }
  if (!run.ok || results.values.empty()) {
    results.failure = output.empty() ? "mpirun failed" : output;
  }
  return results;
}

#ifdef PIPIT_WITH_MPI

inline void report(int rank, const std::string& name, double value) {
  if (rank != 0) return;
  std::printf("mpi-result %s %.6g\n", name.c_str(), value);
  std::fflush(stdout);
}

inline double elapsed(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Rank 0 sends, rank 1 receives and answers the last message with one byte: bytes/s.
inline double raw_mpi_throughput(int rank, size_t size) {
  const int count = message_count(size);
  std::vector<char> buffer(size, 1);
  char ack = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    if (rank == 0) {
      MPI_Send(buffer.data(), static_cast<int>(size), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
    } else {
      MPI_Recv(buffer.data(), static_cast<int>(size), MPI_BYTE, 0, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
    }
  }
  if (rank == 0) {
    MPI_Recv(&ack, 1, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    MPI_Send(&ack, 1, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
  }
  return static_cast<double>(size) * count / elapsed(start);
}

inline double raw_mpi_round_trip_us(int rank, int count) {
  char message[64] = {};
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    if (rank == 0) {
      MPI_Send(message, 64, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(message, 64, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(message, 64, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(message, 64, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  return elapsed(start) * 1e6 / count;
}

// The same two measurements through endpoints 0 (rank 0) and 1 (rank 1) of an MpiTransport.
inline double pipit_mpi_throughput(Communicator& endpoint, size_t size) {
  const int count = message_count(size);
  const Tensor payload = ones({static_cast<int64_t>(size / 4)});
  const auto start = std::chrono::steady_clock::now();
  if (endpoint.id() == 0) {
    for (int i = 0; i < count; ++i) {
      endpoint.send(1, Message(PipelineKind::Activation, 1, i, 0, {payload}));
    }
    endpoint.receive();
  } else {
    for (int i = 0; i < count; ++i) endpoint.receive();
    endpoint.send(0, Message(PipelineKind::Activation, 1));
  }
  return static_cast<double>(size) * count / elapsed(start);
}

inline double pipit_mpi_round_trip_us(Communicator& endpoint, int count) {
  const Tensor payload = zeros({16});  // 64 bytes
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    if (endpoint.id() == 0) {
      endpoint.send(1, Message(PipelineKind::Activation, 1, i, 0, {payload}));
      endpoint.receive();
    } else {
      endpoint.send(0, endpoint.receive());
    }
  }
  return elapsed(start) * 1e6 / count;
}

inline int mpi_transport_role() {
  const int rank = mpi_job().rank;
  // The first messages pay for MPI's connection set-up; neither side should time that.
  raw_mpi_round_trip_us(rank, 100);
  // Each size is timed after an untimed pass of the same messages: this launch is a fresh
  // process, and the first pass pays for first-touch page faults (pipit's receive buffers,
  // MPI's registrations), which is start-up, not throughput. (The TCP rows run their rounds
  // in one process, so their later rounds are warm the same way.)
  for (size_t mib : kThroughputMiB) {
    raw_mpi_throughput(rank, mib << 20);
    report(rank, "raw-" + std::to_string(mib), raw_mpi_throughput(rank, mib << 20));
  }
  report(rank, "raw-rtt", raw_mpi_round_trip_us(rank, kRoundTrips));
  auto transport = MpiTransport::start({{0, 0}, {1, 1}});
  auto endpoint = transport->endpoint(rank);
  pipit_mpi_round_trip_us(*endpoint, 100);
  for (size_t mib : kThroughputMiB) {
    pipit_mpi_throughput(*endpoint, mib << 20);
    report(rank, "pipit-" + std::to_string(mib), pipit_mpi_throughput(*endpoint, mib << 20));
  }
  report(rank, "pipit-rtt", pipit_mpi_round_trip_us(*endpoint, kRoundTrips));
  transport->stop();
  return 0;
}

inline int mpi_gpt_role(int steps) {
  set_num_threads(1);
  const GptStep s = gpt_step_setup();
  Pipeline pipeline(s.model, s.config, Launch::mpi());
  if (!pipeline.is_coordinator()) {
    pipeline.serve();
    return 0;
  }
  report(0, "gpt-ms", median_step_ms(pipeline.coordinator(), s, steps));
  return 0;
}

#endif

}  // namespace pipit::bench

// pipit's transports against their ceilings, measured side by side in one run:
//  1. throughput of activation-sized messages (1, 4, 16, 64 MiB): TcpCommunicator vs tuned
//     blocking sockets (bench/raw_sockets.h) and iperf3 on loopback; MpiTransport vs raw
//     MPI_Send/MPI_Recv between two ranks;
//  2. round trip of a 64-byte message, pipit vs a raw ping-pong, over TCP and over MPI;
//  3. GPT training step time: 4 in-process stages vs 4 pipit-worker processes (TCP) vs 4
//     MPI ranks.
// The MPI rows come from this program started under mpirun (bench/mpi_overhead.h); where
// mpirun is missing or fails they say so. Prints the tables and appends them to
// bench/RESULTS.md (--no-append to skip; --rounds N for fewer alternating rounds; --only
// tcp|mpi|gpt for one part, which is never appended).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "bench/gpt_step.h"
#include "bench/iperf_ceiling.h"
#include "bench/mpi_overhead.h"
#include "bench/raw_sockets.h"
#include "bench/results.h"
#include "codec/atomic_file.h"
#include "comm/tcp_communicator.h"
#include "pipeline/pipeline.h"
#include "pipeline/protocol/messages.h"
#include "pipit.h"
#include "support/flags.h"
#include "support/tcp_pair.h"
#include "support/worker_process.h"

using namespace pipit;
using namespace pipit::bench;
using Clock = std::chrono::steady_clock;

namespace {

double pipit_throughput(size_t size, int count) {
  const support::TcpPair pair = support::connected_tcp_pair();
  Tensor payload = ones({static_cast<int64_t>(size / 4)});
  auto start = Clock::now();
  std::thread receiver([&] {
    for (int i = 0; i < count; ++i) pair.b->receive();
  });
  for (int i = 0; i < count; ++i) {
    pair.a->send(1, Message(PipelineKind::Activation, 1, i, 0, {payload}));
  }
  receiver.join();
  return static_cast<double>(size) * count / seconds_since(start);
}

double pipit_round_trip_us(int count) {
  const support::TcpPair pair = support::connected_tcp_pair();
  Tensor payload = zeros({16});  // 64 bytes
  std::thread echo([&] {
    for (int i = 0; i < count; ++i) pair.b->send(0, pair.b->receive());
  });
  auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    pair.a->send(1, Message(PipelineKind::Activation, 1, i, 0, {payload}));
    pair.a->receive();
  }
  const double us = seconds_since(start) * 1e6 / count;
  echo.join();
  return us;
}

constexpr int kGptSteps = 15;

double tcp_workers_step_ms(const GptStep& s) {
  const support::Workers workers = support::start_workers(4, {.pipit_worker = true});
  TcpOptions tcp;
  tcp.log = [](const std::string&) {};
  Pipeline remote(s.model, s.config, Launch::workers(support::endpoints(workers), tcp));
  return median_step_ms(remote.coordinator(), s, kGptSteps);
}

// "why the MPI rows are missing", as one table cell.
std::string skipped(const std::string& failure) {
  std::string first_line = failure.substr(0, failure.find('\n'));
  std::replace(first_line.begin(), first_line.end(), '|', '/');
  return "skipped: " + first_line.substr(0, 120);
}

struct Tables {
  std::ostringstream text;
  void row(const char* format, auto... values) {
    char line[512];
    std::snprintf(line, sizeof line, format, values...);
    std::printf("%s", line);
    std::fflush(stdout);
    text << line;
  }
  void heading(const std::string& line) {
    std::printf("\n%s\n\n", line.c_str());
    text << "\n" << line << "\n\n";
  }
};

// Medians over `rounds` launches of the MPI transport role; empty with `failure` set when
// MPI cannot run here.
MpiResults mpi_transport_medians(int rounds) {
  std::map<std::string, std::vector<double>> all;
  for (int round = 0; round < rounds; ++round) {
    MpiResults run = mpi_results("--mpi-role transport", 2);
    if (!run.failure.empty()) return run;
    for (const auto& [name, value] : run.values) all[name].push_back(value);
  }
  MpiResults medians;
  for (const auto& [name, values] : all) medians.values[name] = median(values);
  return medians;
}

void throughput_and_round_trip(Tables& tables, int rounds, bool tcp,
                               const std::optional<MpiResults>& mpi) {
  std::optional<double> iperf;
  std::string iperf_cell = "not installed";
  if (tcp && iperf3_installed()) {
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      if (auto rate = iperf3_loopback(3)) runs.push_back(*rate);
    }
    iperf_cell = "failed";
    if (!runs.empty()) {
      iperf = median(runs);
      iperf_cell = std::to_string(static_cast<long>(*iperf / (1 << 20)));
    }
  }
  tables.heading("Throughput on loopback (TCP) and between 2 ranks of one node (MPI), median of " +
                 std::to_string(rounds) +
                 " alternating rounds. TCP raw: blocking send()/recv(), 4 MiB socket buffers, "
                 "1 MiB receive low-water mark. iperf3: its default run (-t 3, median of 3). "
                 "Ceiling: the larger of raw and iperf3 (TCP), raw MPI_Send/MPI_Recv (MPI).");
  tables.row(
      "| transport | message MiB | iperf3 MiB/s | raw MiB/s | pipit MiB/s | pipit / raw | "
      "pipit / ceiling |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t mib : kThroughputMiB) {
    if (!tcp) break;
    const size_t size = mib << 20;
    std::vector<double> raws, pipits;
    for (int round = 0; round < rounds; ++round) {
      raws.push_back(raw_throughput(size, message_count(size)));
      pipits.push_back(pipit_throughput(size, message_count(size)));
    }
    const double raw = median(raws), pipit = median(pipits);
    const double ceiling = std::max(raw, iperf.value_or(0));
    tables.row("| TCP | %zu | %s | %.0f | %.0f | %.2f | %.2f |\n", mib, iperf_cell.c_str(),
               raw / (1 << 20), pipit / (1 << 20), pipit / raw, pipit / ceiling);
  }
  for (size_t mib : kThroughputMiB) {
    if (!mpi) break;
    if (!mpi->failure.empty()) {
      tables.row("| MPI | %zu | - | %s | | | |\n", mib, skipped(mpi->failure).c_str());
      continue;
    }
    const double raw = mpi->values.at("raw-" + std::to_string(mib));
    const double pipit = mpi->values.at("pipit-" + std::to_string(mib));
    tables.row("| MPI | %zu | - | %.0f | %.0f | %.2f | %.2f |\n", mib, raw / (1 << 20),
               pipit / (1 << 20), pipit / raw, pipit / raw);
  }

  tables.heading("Round trip of a 64-byte message: median over " + std::to_string(rounds) +
                 " alternating rounds of the mean of " + std::to_string(kRoundTrips) +
                 " round trips. TCP: two threads of one process; MPI: two ranks.");
  tables.row("| transport | raw us | pipit us | pipit / raw |\n| --- | --- | --- | --- |\n");
  std::vector<double> raws, pipits;
  for (int round = 0; round < rounds && tcp; ++round) {
    raws.push_back(raw_round_trip_us(kRoundTrips));
    pipits.push_back(pipit_round_trip_us(kRoundTrips));
  }
  if (tcp) {
    tables.row("| TCP | %.1f | %.1f | %.2f |\n", median(raws), median(pipits),
               median(pipits) / median(raws));
  }
  if (mpi && mpi->failure.empty()) {
    const double raw = mpi->values.at("raw-rtt"), pipit = mpi->values.at("pipit-rtt");
    tables.row("| MPI | %.1f | %.1f | %.2f |\n", raw, pipit, pipit / raw);
  } else if (mpi) {
    tables.row("| MPI | %s | | |\n", skipped(mpi->failure).c_str());
  }
}

void gpt_steps(Tables& tables, int rounds) {
  const GptStep s = gpt_step_setup();
  std::vector<double> local, tcp, mpi;
  std::string mpi_failure;
  for (int round = 0; round < rounds; ++round) {
    {
      Pipeline pipeline(s.model, s.config);
      local.push_back(median_step_ms(pipeline.coordinator(), s, kGptSteps));
    }
    tcp.push_back(tcp_workers_step_ms(s));
    if (mpi_failure.empty()) {
      MpiResults run = mpi_results("--mpi-role gpt --gpt-steps " + std::to_string(kGptSteps), 4);
      if (run.failure.empty()) {
        mpi.push_back(run.values.at("gpt-ms"));
      } else {
        mpi_failure = run.failure;
      }
    }
  }
  tables.heading(std::string("GPT step, ") + gpt_step_description() + ": median over " +
                 std::to_string(rounds) + " alternating rounds of the median of " +
                 std::to_string(kGptSteps) + " steps");
  tables.row("| stages | ms/step | / in-process |\n| --- | --- | --- |\n");
  const double in_process = median(local);
  tables.row("| 4 in-process stages | %.1f | 1.00 |\n", in_process);
  tables.row("| 4 worker processes (TCP) | %.1f | %.2f |\n", median(tcp), median(tcp) / in_process);
  if (mpi_failure.empty()) {
    tables.row("| 4 MPI ranks | %.1f | %.2f |\n", median(mpi), median(mpi) / in_process);
  } else {
    tables.row("| 4 MPI ranks | %s | |\n", skipped(mpi_failure).c_str());
  }
}

// A rank of the mpirun job mpi_results() started (bench/mpi_overhead.h).
int mpi_role(const support::Flags& flags) {
  const std::string role = flags.choice("mpi-role", {"transport", "gpt"});
#ifdef PIPIT_WITH_MPI
  if (role == "transport") return mpi_transport_role();
  return mpi_gpt_role(static_cast<int>(flags.integer("gpt-steps")));
#else
  flags.fail("--mpi-role " + role + ": this pipit was built without MPI");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("tcp_throughput",
                       "TCP and MPI transports against raw sockets and raw MPI, and a GPT step "
                       "across worker processes.");
  flags.add("rounds", "7", "timed rounds per size (the median is kept)");
  bench::add_no_append_flag(flags);
  flags.add("only", "", "run one part: tcp, mpi or gpt (printed only, never appended)");
  flags.add("mpi-role", "", "internal: transport or gpt, a rank of the mpirun job it starts");
  flags.add("gpt-steps", std::to_string(kGptSteps), "internal, with --mpi-role gpt: timed steps");
  flags.parse(argc, argv);
  if (!flags.str("mpi-role").empty()) return mpi_role(flags);
  const int rounds = static_cast<int>(flags.integer("rounds"));
  const std::string only = flags.choice("only", {"", "tcp", "mpi", "gpt"});
  const bool append = !flags.on("no-append") && only.empty();
  set_num_threads(1);
  signal(SIGPIPE, SIG_IGN);
  Tables tables;
  std::optional<MpiResults> mpi;
  if (only.empty() || only == "mpi") {
#ifdef PIPIT_WITH_MPI
    mpi = mpi_transport_medians(rounds);
#else
    mpi = MpiResults{{}, "pipit was built without MPI"};
#endif
  }
  if (only != "gpt") throughput_and_round_trip(tables, rounds, only != "mpi", mpi);
  if (only.empty() || only == "gpt") gpt_steps(tables, rounds);
  if (append) append_results("tcp_throughput", tables.text.str());
  return 0;
}

// Data-parallel training with a parameter server (ps/): an MLP on synthetic clustered data or
// a character-level GPT (--model gpt, on --data FILE or generated text), `--workers` replicas each
// training on its own batches, the parameters sharded over
// `--servers` servers, in threads, in processes talking TCP, or as MPI ranks.
//   train_ps                                   # sync, 1 server, 2 workers, in threads
//   train_ps --mode async --workers 4 --servers 2 --transport tcp
//   mpirun -np 6 train_ps --launcher mpi --servers 2 --workers 4
//   train_ps --mode bounded --max-staleness 2 --slowdown 1:4
// With --checkpoint DIR every shard saves its weights and optimizer state there (atomically)
// every --checkpoint-every updates and at the end; --resume continues from them.
// --pipit-workers ADDRESSES runs the shards and workers on bare pipit-worker processes (the
// first --servers addresses serve the shards), shipping each worker its data shard.
// The TCP transport starts this program again in a server and a worker role (--role), one
// process each, on 127.0.0.1; their logs go to DIR/<role><index>.log.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "loss/loss.h"
#include "nn/builders.h"
#include "pipit.h"
#include "ps/local_run.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#ifdef PIPIT_WITH_MPI
#include "ps/mpi/mpi_ps.h"
#endif
#include "codec/atomic_file.h"
#include "ps/checkpoint.h"
#include "ps/launch.h"
#include "ps/shard_plan.h"
#include "ps/tcp.h"
#include "serialize/checkpoint.h"
#include "support/child_process.h"
#include "text_data.h"

using namespace pipit;
namespace fs = std::filesystem;

namespace {

struct Setup {
  PsConfig config;
  std::string model = "mlp";                                           // or "gpt"
  int64_t features = 32, classes = 8, hidden = 128, samples = 8192;    // mlp
  std::string data;                                                    // gpt: a text file
  GptConfig gpt{.context = 32, .layers = 2, .heads = 4, .width = 64};  // gpt, less its vocabulary
  int64_t batch = 32, steps = 200;
  uint64_t seed = 1;
  std::vector<double> slowdown;  // per worker
  std::string checkpoint;        // directory; empty: none
  int64_t checkpoint_every = 0;
  bool resume = false;
  std::string token;  // the TCP roles': the launcher makes a fresh one per run
};

// The training data every process rebuilds the same way: clustered points for the MLP (each
// class a Gaussian cloud around its own random centre, as train_mlp), characters for the GPT.
struct Data {
  Tensor x, y;                  // mlp
  std::vector<int64_t> tokens;  // gpt
  int64_t vocabulary = 0;
};

Data make_data(const Setup& s) {
  Data d;
  if (s.model == "gpt") {
    const std::string text =
        s.data.empty() ? samples::generated_text(200000, s.seed) : read_file(s.data);
    PIPIT_CHECK(text.size() > static_cast<size_t>(s.gpt.context) + 1, "the training text has ",
                text.size(), " characters; it needs more than --context + 1");
    const samples::Vocabulary vocabulary(text);
    d.tokens = vocabulary.encode(text);
    d.vocabulary = static_cast<int64_t>(vocabulary.chars.size());
    return d;
  }
  Generator generator(s.seed + 1000);
  Tensor centres = normal({s.classes, s.features}, 0.0, 1.0, &generator);
  std::vector<int64_t> labels(static_cast<size_t>(s.samples));
  for (auto& label : labels) {
    label = static_cast<int64_t>(generator.bits(generator.reserve(1)) %
                                 static_cast<uint64_t>(s.classes));
  }
  d.y = from_vector(labels, {s.samples});
  d.x = embedding(centres, d.y) + normal({s.samples, s.features}, 0.0, 1.0, &generator);
  return d;
}

std::shared_ptr<Sequential> make_model(const Setup& s, const Data& data) {
  Generator generator(s.seed);
  if (s.model == "gpt") {
    GptConfig config = s.gpt;
    config.vocab_size = data.vocabulary;
    return gpt(config, &generator);
  }
  return mlp({s.features, s.hidden, s.hidden, s.classes}, "relu", &generator);
}

// Worker w's batch at its step `step`: in sync mode, the step's large batch is the workers'
// batches side by side, in worker order.
std::pair<Tensor, Tensor> batch_of(const Setup& s, const Data& data, int w, int64_t step) {
  const int64_t index = step * s.config.workers + w;
  if (s.model == "gpt") {
    Generator generator(s.seed * 1000003 + static_cast<uint64_t>(index));
    return samples::sample_batch(data.tokens, s.batch, s.gpt.context, generator);
  }
  const int64_t begin = (index * s.batch) % (s.samples - s.batch + 1);
  return {narrow(data.x, 0, begin, s.batch).contiguous(),
          narrow(data.y, 0, begin, s.batch).contiguous()};
}

// The MLP's accuracy on all its data, or the GPT's loss on 8 fixed batches.
std::string evaluate(const Setup& s, Module& model, const Data& data) {
  NoGradGuard no_grad;
  char text[64];
  if (s.model == "gpt") {
    CrossEntropyLoss loss;
    double total = 0;
    for (int i = 0; i < 8; ++i) {
      Generator generator(777 + static_cast<uint64_t>(i));
      const auto [x, y] = samples::sample_batch(data.tokens, s.batch, s.gpt.context, generator);
      total += loss.compute_loss(model.forward(x), y).item<double>();
    }
    std::snprintf(text, sizeof text, "loss %.4f", total / 8);
    return text;
  }
  const std::vector<int64_t> predicted = argmax(model.forward(data.x), 1).to_vector<int64_t>();
  const std::vector<int64_t> labels = data.y.to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < labels.size(); ++i) right += predicted[i] == labels[i];
  std::snprintf(text, sizeof text, "train accuracy %.2f%%",
                100.0 * static_cast<double>(right) / static_cast<double>(labels.size()));
  return text;
}

// The step a worker starts at: 0, or when resuming, where the versions it read on joining
// say the run was.
int64_t first_step(const Setup& s, const PsWorker& worker) {
  if (!s.resume) return 0;
  const int64_t version = worker.versions().front();
  return s.config.mode == "sync" ? version : version * s.config.accumulate / s.config.workers;
}

void print_stats(const PsServerStats& stats, int shard) {
  std::string histogram;
  for (const auto& [staleness, count] : stats.staleness) {
    histogram.append(" ")
        .append(std::to_string(staleness))
        .append(":")
        .append(std::to_string(count));
  }
  std::printf(
      "shard %d: %lld updates, %lld gradients, %lld refused, %.2f MB pushed, "
      "staleness (versions:gradients)%s\n",
      shard, static_cast<long long>(stats.version), static_cast<long long>(stats.gradients),
      static_cast<long long>(stats.refused), static_cast<double>(stats.pushed_bytes) / 1e6,
      histogram.c_str());
}

// Loads the shard's checkpoint when resuming, and saves one every --checkpoint-every updates.
void attach_checkpoints(const Setup& s, ParameterServer& server) {
  if (s.checkpoint.empty()) return;
  const std::string path = shard_checkpoint_path(s.checkpoint, server.shard(), s.config.servers);
  if (s.resume) load_shard_checkpoint(path, server, s.config.servers);
  const nlohmann::json model_config = make_model(s, make_data(s))->config();
  server.after_update = [&s, path, model_config](const ParameterServer& server) {
    if (s.checkpoint_every > 0 && server.stats().version % s.checkpoint_every == 0) {
      save_shard_checkpoint(path, server, model_config, s.config.optimizer);
    }
  };
}

std::unique_ptr<ParameterServer> make_server(const Setup& s, std::shared_ptr<Communicator> comm,
                                             int shard) {
  auto model = make_model(s, make_data(s));
  const NamedParameters all = model->named_parameters();
  auto server = std::make_unique<ParameterServer>(
      std::move(comm), shard_parameters(all, plan_shards(all, s.config.servers), shard), s.config,
      shard);
  attach_checkpoints(s, *server);
  return server;
}

void save_final(const Setup& s, const ParameterServer& server) {
  if (s.checkpoint.empty()) return;
  save_shard_checkpoint(shard_checkpoint_path(s.checkpoint, server.shard(), s.config.servers),
                        server, make_model(s, make_data(s))->config(), s.config.optimizer);
}

void report(const Setup& s, const StateDict& weights, double seconds, int64_t samples) {
  const Data data = make_data(s);
  auto model = make_model(s, data);
  model->load_state_dict(weights);
  std::printf("trained %lld samples in %.2f s (%.0f samples/s); %s\n",
              static_cast<long long>(samples), seconds, static_cast<double>(samples) / seconds,
              evaluate(s, *model, data).c_str());
}

int run_in_threads(const Setup& s) {
  const Data data = make_data(s);
  PIPIT_CHECK(s.checkpoint.empty(),
              "--checkpoint needs --transport tcp (the in-thread run keeps no checkpoints)");
  auto model = make_model(s, data);
  PsRunOptions options;
  options.steps = s.steps;
  options.batch = [&](int w, int64_t step) { return batch_of(s, data, w, step); };
  options.slowdown = s.slowdown;
  options.on_step = [&](int w, int64_t step, double loss) {
    if (w == 0 && ((step + 1) % 50 == 0 || step == 0)) {
      std::printf("worker 0 step %4lld  loss %.4f\n", static_cast<long long>(step + 1), loss);
    }
  };
  const PsRunReport result = train_ps_locally(*model, s.config, options);
  for (size_t shard = 0; shard < result.servers.size(); ++shard) {
    print_stats(result.servers[shard], static_cast<int>(shard));
  }
  if (s.config.compress) {
    int64_t pushed = 0, uncompressed = 0;
    for (const PsWorkerStats& w : result.workers) {
      pushed += w.pushed_bytes;
      uncompressed += w.uncompressed_bytes;
    }
    std::printf("bf16 pushes: %.2f MB instead of %.2f MB (%.2f MB saved)\n", pushed / 1e6,
                uncompressed / 1e6, (uncompressed - pushed) / 1e6);
  }
  report(s, result.weights, result.seconds, s.steps * s.config.workers * s.batch);
  return 0;
}

#ifdef PIPIT_WITH_MPI
// This rank's shard or worker (mpirun -np servers+workers). Shards save their checkpoints
// with --checkpoint DIR (a directory every node sees) and print their statistics; worker 0
// prints its progress.
int run_under_mpi(const Setup& s) {
  PIPIT_CHECK(!s.resume, "--resume is not supported with --launcher mpi");
  const Data data = make_data(s);
  auto model = make_model(s, data);
  PsRunOptions options;
  options.steps = s.steps;
  options.batch = [&](int w, int64_t step) { return batch_of(s, data, w, step); };
  options.slowdown = s.slowdown;
  options.on_server_start = [&s](ParameterServer& server) { attach_checkpoints(s, server); };
  options.on_server_end = [&s](const ParameterServer& server) { save_final(s, server); };
  options.on_step = [](int w, int64_t step, double loss) {
    if (w == 0 && ((step + 1) % 50 == 0 || step == 0)) {
      std::printf("worker 0 step %4lld  loss %.4f\n", static_cast<long long>(step + 1), loss);
      std::fflush(stdout);
    }
  };
  const MpiPsRole role = mpi_ps_role(s.config, mpi_job().rank);
  // mpirun names a rank that dies; this line maps it to its role and node.
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::printf("[mpi] rank %d on %s: %s %d\n", mpi_job().rank, host,
              role.server ? "shard" : "worker", role.index);
  std::fflush(stdout);
  const PsRunReport result = train_ps_over_mpi(*model, s.config, options);
  if (role.server) {
    print_stats(result.servers[role.index], role.index);
  } else if (role.index == 0) {
    std::printf("worker 0: %lld samples in %.2f s (%.0f samples/s per worker)\n",
                static_cast<long long>(s.steps * s.batch), result.seconds,
                static_cast<double>(s.steps * s.batch) / result.seconds);
  }
  return 0;
}
#endif

// Every role on a bare pipit-worker: each worker gets its batches of every step as its data.
int run_on_workers(const Setup& s, const std::vector<std::string>& addresses,
                   const TcpOptions& tcp) {
  PIPIT_CHECK(s.checkpoint.empty() && !s.resume && s.slowdown.empty(),
              "--checkpoint, --resume and --slowdown are not supported with --pipit-workers");
  const Data data = make_data(s);
  std::vector<PsWorkerData> shards;
  for (int w = 0; w < s.config.workers; ++w) {
    std::vector<Tensor> xs, ys;
    for (int64_t step = 0; step < s.steps; ++step) {
      const auto [x, y] = batch_of(s, data, w, step);
      xs.push_back(x);
      ys.push_back(y);
    }
    shards.push_back({cat(xs, 0), cat(ys, 0)});
  }
  const auto start = std::chrono::steady_clock::now();
  const PsLaunchResult result =
      train_ps_on_workers(*make_model(s, data), s.config, shards, s.batch, s.steps, addresses, tcp);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("shard 0: %lld updates\n", static_cast<long long>(result.version));
  report(s, result.weights, seconds, s.steps * s.config.workers * s.batch);
  return 0;
}

TcpOptions tcp_options(const Setup& s) {
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(std::min<int64_t>(s.config.timeout.count(), 5000));
  tcp.token = s.token;
  return tcp;
}

// A fresh random token for this run's roles, in a file only this user may read, so no other
// process on the machine can join the run.
void write_run_token(const fs::path& path) {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  random.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  PIPIT_CHECK(random.gcount() == static_cast<std::streamsize>(sizeof bytes),
              "could not read /dev/urandom for the run's token");
  std::string hex;
  for (unsigned char b : bytes) {
    char pair[3];
    std::snprintf(pair, sizeof pair, "%02x", b);
    hex += pair;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  PIPIT_CHECK(fd >= 0, "cannot create the run's token file ", path.string());
  const bool written = ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  ::close(fd);
  PIPIT_CHECK(written, "cannot write the run's token file ", path.string());
}

int server_role(const Setup& s, int shard, const std::string& port_file) {
  uint16_t port = 0;
  auto comm = listen_as_ps_shard(s.config, shard, "127.0.0.1:0", tcp_options(s), &port);
  auto server = make_server(s, comm, shard);
  write_file_atomic(port_file, std::to_string(port) + "\n");
  server->serve();
  save_final(s, *server);
  print_stats(server->stats(), shard);
  comm->close();
  return 0;
}

int worker_role(const Setup& s, int w, const std::vector<std::string>& servers) {
  auto comm = connect_as_ps_worker(s.config, w, servers, tcp_options(s));
  const Data data = make_data(s);
  PsWorker worker(comm, make_model(s, data), s.config, w, s.slowdown.empty() ? 1.0 : s.slowdown[w]);
  worker.join();
  for (int64_t step = first_step(s, worker); step < s.steps; ++step) {
    const auto [x, y] = batch_of(s, data, w, step);
    const double loss = worker.step(x, y);
    if (w == 0 && ((step + 1) % 50 == 0 || step == 0)) {
      std::printf("worker 0 step %4lld  loss %.4f\n", static_cast<long long>(step + 1), loss);
      std::fflush(stdout);
    }
  }
  worker.leave();
  comm->close();
  return 0;
}

// Starts every server and worker as a process of this program and waits for them all; the
// first that fails stops the rest.
int run_processes(const Setup& s, const std::vector<std::string>& role_flags) {
  const fs::path dir = s.checkpoint.empty()
                           ? fs::temp_directory_path() / ("pipit_ps_" + std::to_string(getpid()))
                           : fs::path(s.checkpoint);
  fs::create_directories(dir);
  const fs::path token_file =
      fs::temp_directory_path() / ("pipit_ps_token_" + std::to_string(getpid()));
  write_run_token(token_file);
  struct RemoveToken {
    fs::path path;
    ~RemoveToken() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove_token{token_file};
  std::vector<std::unique_ptr<support::ChildProcess>> children;
  auto start = [&](const std::string& role, int index, std::vector<std::string> extra) {
    std::vector<std::string> argv = {fs::read_symlink("/proc/self/exe").string(),
                                     "--role",
                                     role,
                                     "--index",
                                     std::to_string(index),
                                     "--token-file",
                                     token_file.string()};
    argv.insert(argv.end(), role_flags.begin(), role_flags.end());
    if (s.checkpoint.empty()) {  // the final weights come back through a temporary one
      argv.insert(argv.end(), {"--checkpoint", dir.string(), "--checkpoint-every", "0"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::string log = (dir / (role + std::to_string(index) + ".log")).string();
    children.push_back(std::make_unique<support::ChildProcess>(argv, log, log));
  };
  const auto begin = std::chrono::steady_clock::now();
  std::vector<std::string> endpoints;
  for (int shard = 0; shard < s.config.servers; ++shard) {
    const std::string name = "server" + std::to_string(shard);
    const std::string port_file = (dir / (name + ".port")).string();
    fs::remove(port_file);
    start("server", shard, {"--port-file", port_file});
    const std::string port = support::wait_for_file(
        *children.back(), port_file, std::chrono::seconds(10), (dir / (name + ".log")).string());
    endpoints.push_back("127.0.0.1:" + port.substr(0, port.find('\n')));
  }
  std::string joined;
  for (const auto& e : endpoints) joined += (joined.empty() ? "" : ",") + e;
  for (int w = 0; w < s.config.workers; ++w) start("worker", w, {"--server-endpoints", joined});
  std::printf("started %d servers and %d workers (logs in %s)\n", s.config.servers,
              s.config.workers, dir.string().c_str());
  std::fflush(stdout);
  int failed = -1;
  for (bool running = true; running && failed < 0;) {
    running = false;
    for (size_t i = 0; i < children.size(); ++i) {
      const std::optional<int> status = children[i]->exit_status();
      if (!status) running = true;
      if (status && *status != 0) failed = static_cast<int>(i);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  auto log_of = [&](size_t i) {
    const bool server = static_cast<int>(i) < s.config.servers;
    const int index = server ? static_cast<int>(i) : static_cast<int>(i) - s.config.servers;
    return (dir / ((server ? "server" : "worker") + std::to_string(index) + ".log")).string();
  };
  if (failed >= 0) {
    for (auto& child : children) child->kill();
    std::fprintf(stderr, "train_ps: %s failed; its log:\n%s", log_of(failed).c_str(),
                 read_file(log_of(failed)).c_str());
    return 1;
  }
  // Worker 0's progress and every shard's statistics, without the connection log lines.
  auto print_log = [](const std::string& path) {
    std::istringstream lines(read_file(path));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("[tcp ", 0) != 0) std::printf("%s\n", line.c_str());
    }
  };
  print_log(log_of(static_cast<size_t>(s.config.servers)));
  StateDict weights;
  for (int shard = 0; shard < s.config.servers; ++shard) {
    print_log(log_of(static_cast<size_t>(shard)));
    const Checkpoint c =
        load_checkpoint(shard_checkpoint_path(dir.string(), shard, s.config.servers));
    weights.insert(c.weights.begin(), c.weights.end());
  }
  report(s, weights, seconds, s.steps * s.config.workers * s.batch);
  if (s.checkpoint.empty()) fs::remove_all(dir);
  return 0;
}

void add_flags(support::Flags& flags) {
  flags.add("mode", "sync", "sync, async (AsySG-InCon) or bounded (stale-synchronous)");
  flags.add("servers", "1", "parameter-server shards");
  flags.add("workers", "2", "data-parallel workers");
  flags.add("accumulate", "1", "async and bounded: gradients per update");
  flags.add("max-staleness", "4", "bounded: the most versions a gradient may lag");
  flags.add("min-workers", "0", "sync: go on without lost workers while this many live (0: all)");
  flags.add_switch("compress", "push gradients as bf16 with error feedback");
  flags.add("optimizer", "sgd", "sgd (momentum 0.9) or adamw");
  flags.add("lr", "0.05", "learning rate");
  flags.add("steps", "200", "steps per worker");
  flags.add("batch", "32", "samples per worker step");
  flags.add("model", "mlp",
            "mlp (synthetic clusters) or gpt (a character-level GPT, shaped by --layers, "
            "--heads, --width and --context)");
  flags.add("hidden", "128", "mlp: hidden width (two hidden layers)");
  flags.add("data", "", "gpt: a text file (default: text generated by the program)");
  support::add_gpt_flags(flags, Setup{}.gpt, support::GptVocabulary::from_data);
  flags.add("seed", "1", "random seed (model and data)");
  flags.add("transport", "threads", "threads (one process) or tcp (a process per role)");
  flags.add("launcher", "none",
            "mpi: this process is one rank of mpirun -np servers+workers (shards first)");
  flags.add("token-file", "",
            "with --pipit-workers: the file holding their shared token (--transport tcp makes "
            "a fresh one per run)");
  flags.add("pipit-workers", "",
            "host:port of --servers + --workers running pipit-workers (instead of --transport)");
  flags.add_repeatable("slowdown", "WORKER:FACTOR: that worker computes FACTOR times slower");
  flags.add("checkpoint", "", "directory for shard checkpoints (tcp transport)");
  flags.add("checkpoint-every", "50", "save every this many updates (with --checkpoint)");
  flags.add_switch("resume", "continue from the checkpoints in --checkpoint");
  flags.add("timeout-ms", "60000", "the longest any side waits for a message");
  flags.add("role", "", "internal: server or worker (started by --transport tcp)");
  flags.add("index", "0", "internal: the role's shard or worker index");
  flags.add("port-file", "", "internal: where a server writes its port");
  flags.add("server-endpoints", "", "internal: host:port of every shard, comma-separated");
}

// --slowdown WORKER:FACTOR ...: every worker's factor, 1 for those not named; none when none is.
std::vector<double> slowdown_of(const support::Flags& flags, int workers) {
  std::vector<double> slowdown;
  for (const std::string& item : flags.all("slowdown")) {
    const size_t colon = item.find(':');
    char* end = nullptr;
    const long worker = colon == std::string::npos ? -1 : std::strtol(item.c_str(), &end, 10);
    const double factor = colon == std::string::npos ? 0 : std::atof(item.c_str() + colon + 1);
    if (worker < 0 || worker >= workers || end != item.c_str() + colon || factor < 1) {
      flags.fail("--slowdown expects WORKER:FACTOR with a worker in [0, " +
                 std::to_string(workers) + ") and a factor >= 1, got '" + item + "'");
    }
    slowdown.resize(static_cast<size_t>(workers), 1.0);
    slowdown[static_cast<size_t>(worker)] = factor;
  }
  return slowdown;
}

Setup setup_of(const support::Flags& flags) {
  Setup s;
  s.config.mode = flags.str("mode");
  s.config.servers = static_cast<int>(flags.integer("servers"));
  s.config.workers = static_cast<int>(flags.integer("workers"));
  s.config.accumulate = static_cast<int>(flags.integer("accumulate"));
  s.config.max_staleness = static_cast<int>(flags.integer("max-staleness", 0));
  s.config.min_workers = static_cast<int>(flags.integer("min-workers", 0));
  s.config.compress = flags.on("compress");
  s.config.timeout = std::chrono::milliseconds(flags.integer("timeout-ms"));
  if (flags.choice("optimizer", {"sgd", "adamw"}) == "sgd") {
    s.config.optimizer = {{"type", "SGD"}, {"lr", flags.number("lr")}, {"momentum", 0.9}};
  } else {
    s.config.optimizer = {{"type", "AdamW"}, {"lr", flags.number("lr")}};
  }
  s.steps = flags.integer("steps");
  s.batch = flags.integer("batch");
  s.hidden = flags.integer("hidden");
  s.model = flags.choice("model", {"mlp", "gpt"});
  s.data = flags.str("data");
  s.gpt = support::gpt_config(flags);
  s.seed = static_cast<uint64_t>(flags.integer("seed", 0));
  s.checkpoint = flags.str("checkpoint");
  s.checkpoint_every = flags.integer("checkpoint-every", 0);
  s.resume = flags.on("resume");
  if (s.resume && s.checkpoint.empty()) flags.fail("--resume needs --checkpoint DIR");
  if (s.model == "mlp" && s.batch > s.samples) {
    flags.fail("--batch must not exceed " + std::to_string(s.samples));
  }
  s.slowdown = slowdown_of(flags, s.config.workers);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("train_ps",
                       "Data-parallel training of an MLP with a parameter server (ps/).");
  add_flags(flags);
  flags.parse(argc, argv);
  Setup s = setup_of(flags);
  const std::string transport = flags.choice("transport", {"threads", "tcp"});
  const std::string role = flags.choice("role", {"", "server", "worker"});
  const std::string launcher = flags.choice("launcher", {"none", "mpi"});
  try {
    validate(s.config);
    set_num_threads(1);  // one core per worker or server: they run side by side
    const int index = static_cast<int>(flags.integer("index", 0));
    if (!role.empty() && !flags.str("token-file").empty()) {
      s.token = read_token_file(flags.str("token-file"));
    }
    if (role == "server") return server_role(s, index, flags.str("port-file"));
    if (role == "worker") return worker_role(s, index, flags.items("server-endpoints"));
    if (launcher == "mpi") {
#ifdef PIPIT_WITH_MPI
      return run_under_mpi(s);
#else
      flags.fail("--launcher mpi: this pipit was built without MPI");
#endif
    }
    std::printf("train_ps: %s, %d server(s), %d worker(s), %s, batch %lld per worker\n",
                s.config.mode.c_str(), s.config.servers, s.config.workers,
                flags.str("pipit-workers").empty() ? transport.c_str() : "pipit-workers",
                static_cast<long long>(s.batch));
    if (!flags.str("pipit-workers").empty()) {
      TcpOptions tcp;
      if (!flags.str("token-file").empty()) tcp.token = read_token_file(flags.str("token-file"));
      return run_on_workers(s, flags.items("pipit-workers"), tcp);
    }
    if (transport == "threads") return run_in_threads(s);
    // The roles get this run's flags back, minus the launcher's own.
    return run_processes(s, flags.given({"transport", "token-file"}));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_ps: %s\n", e.what());
    return 1;
  }
}

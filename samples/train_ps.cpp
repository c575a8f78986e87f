// Data-parallel training with a parameter server (ps/): an MLP on synthetic clustered data or
// a character-level GPT (--model gpt, on --data FILE or generated text), `--workers` replicas each
// training on its own batches, the parameters sharded over `--servers` servers, in threads, in
// pipit-worker processes over TCP, or as MPI ranks: one train_ps call whatever the transport.
//   train_ps                                   # sync, 1 server, 2 workers, in threads
//   train_ps --mode async --workers 4 --servers 2 --transport tcp
//   mpirun -np 6 train_ps --launcher mpi --servers 2 --workers 4
//   train_ps --mode bounded --max-staleness 2 --slowdown 1:4
// With --checkpoint DIR every shard saves its weights and optimizer state there (atomically)
// every --checkpoint-every updates and at the end; --resume continues from them.
// --transport tcp starts a pipit-worker process per role on 127.0.0.1 (with a fresh token);
// --pipit-workers ADDRESSES uses running ones (the first --servers addresses serve the
// shards), shipping each worker its batches.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <unistd.h>

#include "codec/atomic_file.h"
#include "comm/mpi/mpi_communicator.h"
#include "loss/loss.h"
#include "nn/builders.h"
#include "pipit.h"
#include "ps/launch.h"
#include "support/flags.h"
#include "support/gpt_flags.h"
#include "support/worker_process.h"
#include "text_data.h"

using namespace pipit;

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

// " 0:12 1:3": a histogram's entries, key:count.
std::string histogram(const std::map<int64_t, int64_t>& counts) {
  std::string text;
  for (const auto& [key, count] : counts) {
    text.append(" ").append(std::to_string(key)).append(":").append(std::to_string(count));
  }
  return text;
}

void print_stats(const PsServerStats& stats, int shard) {
  std::printf(
      "shard %d: %lld updates, %lld gradients, %lld refused, %.2f MB pushed, "
      "staleness (versions:gradients)%s%s%s\n",
      shard, static_cast<long long>(stats.version), static_cast<long long>(stats.gradients),
      static_cast<long long>(stats.refused), static_cast<double>(stats.pushed_bytes) / 1e6,
      histogram(stats.staleness).c_str(),
      stats.lead.empty() ? "" : ", lead (steps ahead of the slowest:reads)",
      histogram(stats.lead).c_str());
}

void report(const Setup& s, const StateDict& weights, double seconds, int64_t samples) {
  const Data data = make_data(s);
  auto model = make_model(s, data);
  model->load_state_dict(weights);
  std::printf("trained %lld samples in %.2f s (%.0f samples/s); %s\n",
              static_cast<long long>(samples), seconds, static_cast<double>(samples) / seconds,
              evaluate(s, *model, data).c_str());
}

PsRunOptions run_options(const Setup& s, const Data& data) {
  PsRunOptions options;
  options.steps = s.steps;
  options.batch = [&s, &data](int w, int64_t step) { return batch_of(s, data, w, step); };
  options.slowdown = s.slowdown;
  options.on_step = [](int w, int64_t step, double loss) {
    if (w == 0 && ((step + 1) % 50 == 0 || step == 0)) {
      std::printf("worker 0 step %4lld  loss %.4f\n", static_cast<long long>(step + 1), loss);
      std::fflush(stdout);
    }
  };
  options.checkpoint_dir = s.checkpoint;
  options.checkpoint_every = s.checkpoint_every;
  options.resume = s.resume;
  return options;
}

// A fresh random token for one run's roles, so no other process on the machine can join it.
std::string random_token() {
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
  return hex;
}

// What this process holds of the run: every shard's statistics (under MPI a shard's rank its
// own, worker 0's rank its pace), the pushes' compression, and the final model where every
// weight is here.
void print_report(const Setup& s, const PsRunReport& result, size_t weights) {
  for (size_t shard = 0; shard < result.servers.size(); ++shard) {
    const PsServerStats& stats = result.servers[shard];
    if (stats.gradients > 0) {
      print_stats(stats, static_cast<int>(shard));
    } else if (stats.version > 0) {  // a shard on a pipit-worker reports its version alone
      std::printf("shard %zu: %lld updates\n", shard, static_cast<long long>(stats.version));
    }
  }

  int64_t pushed = 0, uncompressed = 0;
  for (const PsWorkerStats& w : result.workers) {
    pushed += w.pushed_bytes;
    uncompressed += w.uncompressed_bytes;
  }
  if (s.config.compress && uncompressed > 0) {
    std::printf("bf16 pushes: %.2f MB instead of %.2f MB (%.2f MB saved)\n", pushed / 1e6,
                uncompressed / 1e6, (uncompressed - pushed) / 1e6);
  }
  // A resumed run's steps begin where its checkpoints were.
  const int64_t steps = s.steps - result.first_step;
  if (result.weights.size() == weights) {
    report(s, result.weights, result.seconds, steps * s.config.workers * s.batch);
  } else if (!result.losses.empty() && !result.losses[0].empty()) {
    const int64_t samples = steps * s.batch;
    std::printf("worker 0: %lld samples in %.2f s (%.0f samples/s per worker)\n",
                static_cast<long long>(samples), result.seconds,
                static_cast<double>(samples) / result.seconds);
  }
}

void add_flags(support::Flags& flags) {
  flags.add("mode", "sync", "sync, async (AsySG-InCon) or bounded (stale-synchronous)");
  flags.add("servers", "1", "parameter-server shards");
  flags.add("workers", "2", "data-parallel workers");
  flags.add("accumulate", "1", "async and bounded: gradients per update");
  flags.add("max-staleness", "4", "bounded: the most versions a gradient may lag");
  flags.add("min-workers", "0", "sync: go on without lost workers while this many live (0: all)");
  flags.add_switch("compress", "push gradients as bf16 with error feedback");
  flags.add_switch("no-overlap",
                   "push after the backward, not each shard's gradients as soon as final");
  flags.add("optimizer", "sgd", "sgd (with --momentum) or adamw");
  flags.add("momentum", "auto",
            "sgd's momentum; auto: 0.9 in sync mode, less what asynchrony adds in async and "
            "bounded (about 1 - accumulate / workers), so that the two do not sum past 1");
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
  flags.add("transport", "threads",
            "threads (one process) or tcp (a pipit-worker process per role, started here)");
  flags.add("launcher", "none",
            "mpi: this process is one rank of mpirun -np servers+workers (shards first)");
  flags.add("token-file", "",
            "with --pipit-workers: the file holding their shared token (--transport tcp makes "
            "a fresh one per run)");
  flags.add("pipit-workers", "",
            "host:port of --servers + --workers running pipit-workers (instead of --transport)");
  flags.add_repeatable("slowdown", "WORKER:FACTOR: that worker computes FACTOR times slower");
  flags.add("checkpoint", "", "directory for the shards' checkpoints");
  flags.add("checkpoint-every", "50", "save every this many updates (with --checkpoint)");
  flags.add_switch("resume", "continue from the checkpoints in --checkpoint");
  flags.add("timeout-ms", "60000", "the longest any side waits for a message");
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

// Stale gradients act as momentum of about 1 - accumulate / workers (Mitliagkas et al.,
// "Asynchrony begets momentum", 2016): async and bounded runs keep the sum near sync's 0.9,
// where 0.9 on top of it made 4 async workers diverge now and then.
double momentum_of(const support::Flags& flags, const PsConfig& config) {
  if (flags.str("momentum") != "auto") {
    const double momentum = flags.number("momentum");
    if (momentum < 0 || momentum >= 1) flags.fail("--momentum must be in [0, 1)");
    return momentum;
  }
  if (config.mode == "sync") return 0.9;
  const double implicit = 1.0 - std::min(1.0, static_cast<double>(config.accumulate) /
                                                  static_cast<double>(config.workers));
  return std::max(0.0, 0.9 - implicit);
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
  s.config.overlap = !flags.on("no-overlap");
  s.config.timeout = std::chrono::milliseconds(flags.integer("timeout-ms"));
  if (flags.choice("optimizer", {"sgd", "adamw"}) == "sgd") {
    s.config.optimizer = {
        {"type", "SGD"}, {"lr", flags.number("lr")}, {"momentum", momentum_of(flags, s.config)}};
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

// Where the run's roles go, the one choice that differs between transports: threads here,
// pipit-worker processes started here (--transport tcp) or given (--pipit-workers), or the
// ranks of this MPI job.
PsLaunch launch_of(const Setup& s, const support::Flags& flags,
                   std::optional<support::Workers>& started) {
  if (flags.choice("launcher", {"none", "mpi"}) == "mpi") return PsLaunch::mpi();
  TcpOptions tcp;
  tcp.peer_timeout = std::chrono::milliseconds(std::min<int64_t>(s.config.timeout.count(), 5000));
  tcp.log = [](const std::string&) {};  // the run's failures reach it as errors
  if (!flags.str("pipit-workers").empty()) {
    if (!flags.str("token-file").empty()) tcp.token = read_token_file(flags.str("token-file"));
    return PsLaunch::hosts(flags.items("pipit-workers"), tcp);
  }
  if (flags.choice("transport", {"threads", "tcp"}) == "threads") return PsLaunch::threads();
  tcp.token = random_token();
  started = support::start_workers(s.config.servers + s.config.workers,
                                   {.pipit_worker = true, .token = tcp.token});
  return PsLaunch::hosts(support::endpoints(*started), tcp);
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("train_ps",
                       "Data-parallel training of an MLP with a parameter server (ps/).");
  add_flags(flags);
  flags.parse(argc, argv);
  const Setup s = setup_of(flags);
  try {
    validate(s.config);
    set_num_threads(1);  // one core per worker or server: they run side by side
    std::optional<support::Workers> started;
    const PsLaunch launch = launch_of(s, flags, started);
    if (launch.kind == PsLaunch::Kind::mpi) {
#ifdef PIPIT_WITH_MPI
      // mpirun names a rank that dies; this line maps it to its role and node.
      const int rank = mpi_job().rank;
      char host[256] = "?";
      gethostname(host, sizeof host - 1);
      std::printf("[mpi] rank %d on %s: %s %d\n", rank, host,
                  rank < s.config.servers ? "shard" : "worker",
                  rank < s.config.servers ? rank : rank - s.config.servers);
#endif
    } else {
      std::printf("train_ps: %s, %d server(s), %d worker(s), %s, batch %lld per worker\n",
                  s.config.mode.c_str(), s.config.servers, s.config.workers,
                  launch.kind == PsLaunch::Kind::threads ? "threads" : "pipit-workers",
                  static_cast<long long>(s.batch));
    }
    std::fflush(stdout);
    const Data data = make_data(s);
    const auto model = make_model(s, data);
    const PsRunReport result = train_ps(*model, s.config, run_options(s, data), launch);
    print_report(s, result, model->state_dict().size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_ps: %s\n", e.what());
    return 1;
  }
}

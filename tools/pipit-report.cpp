// pipit-report: a training run as one self-contained HTML page (train/run_report.h).
//   pipit-report METRICS.jsonl [--trace TRACE.json] [-o report.html] [--title TEXT]
// METRICS.jsonl is train_gpt --metrics FILE's; TRACE.json is train_gpt --trace FILE's. The
// page draws the training and validation loss, tokens/s and the pipeline's timeline with
// inline SVG, and opens without a network. Errors name the file and line at fault.
#include <cstdio>
#include <fstream>

#include "codec/atomic_file.h"
#include "support/flags.h"
#include "tensor/error.h"
#include "train/run_report.h"

using namespace pipit;

namespace {

std::vector<Progress> read_metrics(const std::string& path) {
  std::ifstream in(path);
  PIPIT_CHECK(in.good(), "cannot read '", path, "'");
  std::vector<Progress> metrics;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      metrics.push_back(progress_from_json(nlohmann::json::parse(line)));
    } catch (const std::exception& e) {
      throw Error(path + ":" + std::to_string(number) + ": " + e.what());
    }
  }
  PIPIT_CHECK(!metrics.empty(), "'", path, "' holds no metrics lines");
  return metrics;
}

}  // namespace

int main(int argc, char** argv) {
  support::Flags flags("pipit-report",
                       "Draws a training run (train_gpt --metrics, --trace) as one HTML page.");
  flags.add_positional("METRICS", "the run's metrics file (JSON lines)");
  flags.add("trace", "", "a Chrome trace of the run's last steps (train_gpt --trace)");
  flags.add("o", "report.html", "the page to write (-o or --o)");
  flags.add("title", "", "the page's title (default: the metrics file's name)");
  flags.parse(argc, argv);
  try {
    const std::string metrics_path = flags.positional("METRICS");
    const std::vector<Progress> metrics = read_metrics(metrics_path);
    nlohmann::json trace;
    if (!flags.str("trace").empty()) {
      try {
        trace = nlohmann::json::parse(read_file(flags.str("trace")));
      } catch (const nlohmann::json::exception& e) {
        throw Error("'" + flags.str("trace") + "' is not JSON: " + e.what());
      }
    }
    const std::string title = flags.str("title").empty() ? metrics_path : flags.str("title");
    write_file_atomic(flags.str("o"), run_report_html(metrics, trace, title));
    std::printf("pipit-report: %zu progress lines%s -> %s\n", metrics.size(),
                trace.is_null() ? "" : " and a trace", flags.str("o").c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipit-report: %s\n", e.what());
    return 1;
  }
  return 0;
}

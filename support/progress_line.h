#pragma once
// A progress line for long work (encoding gigabytes of text, training a tokenizer, writing a
// large checkpoint): "encode: 12.3 of 45.6 MB (27%), 8.1 MB/s, 4 s left", redrawn in place on
// stderr at most 10 times a second, and only when stderr is a terminal: a log file or a pipe
// gets none of it.
#include <chrono>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace pipit::support {

class ProgressLine {
 public:
  // `total` units of `unit` ("MB", "tokens") to do; `scale` divides raw counts into units.
  ProgressLine(std::string what, double total, std::string unit, double scale = 1,
               bool on_terminal = isatty(STDERR_FILENO) == 1)
      : what_(std::move(what)),
        unit_(std::move(unit)),
        total_(total / scale),
        scale_(scale),
        enabled_(on_terminal) {}
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // With `raw_total`, the total learnt on the way (a file's size).
  void update(double raw_done, double raw_total) {
    total_ = raw_total / scale_;
    update(raw_done);
  }
  void update(double raw_done) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    std::fprintf(stderr, "\r%s\033[K", text(raw_done / scale_, seconds_since_start()).c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  // Clears the line, so the program's own summary line stands alone.
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

  // The line for `done` units after `seconds`.
  std::string text(double done, double seconds) const {
    char line[256];
    const double rate = seconds > 0 ? done / seconds : 0;
    const double left = rate > 0 ? (total_ - done) / rate : 0;
    std::snprintf(line, sizeof line, "%s: %.1f of %.1f %s (%.0f%%), %.1f %s/s, %.0f s left",
                  what_.c_str(), done, total_, unit_.c_str(),
                  total_ > 0 ? 100 * done / total_ : 100, rate, unit_.c_str(), left);
    return line;
  }

 private:
  double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  std::string what_, unit_;
  double total_, scale_;
  bool enabled_, drawn_ = false;
  // Nothing is drawn in the first 100 ms: short work stays silent.
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

}  // namespace pipit::support

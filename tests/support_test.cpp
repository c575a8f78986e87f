// What the programs share (support/): the progress line's text, and one-dash one-letter flags.
#include <catch2/catch.hpp>

#include "support/flags.h"
#include "support/progress_line.h"

using namespace pipit::support;

TEST_CASE("a progress line says how far, how fast and how long is left", "[support]") {
  const ProgressLine line("encode", 45.6e6, "MB", 1e6, /*on_terminal=*/false);
  CHECK(line.text(12.0, 1.5) == "encode: 12.0 of 45.6 MB (26%), 8.0 MB/s, 4 s left");
  CHECK(line.text(45.6, 5.7) == "encode: 45.6 of 45.6 MB (100%), 8.0 MB/s, 0 s left");
  const ProgressLine tokens("train", 1000, "tokens", 1, false);
  CHECK(tokens.text(250, 0.5) == "train: 250.0 of 1000.0 tokens (25%), 500.0 tokens/s, 2 s left");
}

TEST_CASE("a one-letter flag may be given with one dash", "[support]") {
  Flags flags("program", "test");
  flags.add("o", "report.html", "out");
  flags.add_positional("IN", "in");
  const char* argv[] = {"program", "metrics.jsonl", "-o", "page.html"};
  flags.parse(4, const_cast<char**>(argv));
  CHECK(flags.str("o") == "page.html");
  CHECK(flags.positional("IN") == "metrics.jsonl");
}

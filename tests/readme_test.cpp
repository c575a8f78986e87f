#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

namespace {
std::string read(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}
}  // namespace

TEST_CASE("the README's tour is samples/tour.cpp verbatim", "[docs]") {
  const std::string readme = read(PIPIT_SOURCE_DIR "/README.md");
  const std::string tour = read(PIPIT_SOURCE_DIR "/samples/tour.cpp");
  CHECK(readme.find("```cpp\n" + tour + "```") != std::string::npos);
}

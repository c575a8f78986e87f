#pragma once
// Every failure in pipit is a pipit::Error whose message names the operation and the
// values (shapes, dtypes, dims, files) that were wrong.
#include <sstream>
#include <stdexcept>
#include <string>

namespace pipit {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace pipit

// PIPIT_CHECK(cond, parts...) throws pipit::Error with the parts streamed together.
#define PIPIT_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) throw ::pipit::Error(::pipit::detail::concat(__VA_ARGS__)); \
  } while (0)

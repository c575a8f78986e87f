#pragma once
// What text/ throws. text/ uses only the standard library, so it cannot throw pipit::Error
// (tensor/); its messages follow the same rule: they name the file, token, id or byte offset
// that was wrong.
#include <stdexcept>

namespace pipit::text {

class TextError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace pipit::text

#pragma once
// What every harness checks, in one place: which exceptions count as a refusal, and when two
// decoded values are the same (round trips, two decoding paths).
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "comm/message.h"
#include "tensor/error.h"
#include "tensor/state_dict.h"
#include "tests/fuzz/harness/harness.h"

namespace pipit::fuzz {

// The readable name of an exception's dynamic type ("std::out_of_range").
std::string type_name(const std::type_info& type);

// Runs `decode`: true when it returns, false when it throws an E (the refusal its callers
// catch). Any other exception is a Finding naming `what` and the exception's type.
template <typename E = Error, typename F>
bool refuses_only_with(std::string_view what, F&& decode) {
  try {
    decode();
    return true;
  } catch (const Finding&) {
    throw;
  } catch (const E&) {
    return false;
  } catch (const std::exception& e) {
    throw Finding(std::string(what) + " threw " + type_name(typeid(e)) + " instead of " +
                  type_name(typeid(E)) + ": " + e.what());
  } catch (...) {
    throw Finding(std::string(what) + " threw something that is not a std::exception");
  }
}

// Runs `step`, which must not throw at all (re-encoding what was decoded, decoding that
// again): any exception is a Finding.
template <typename F>
void must_not_throw(std::string_view what, F&& step) {
  try {
    step();
  } catch (const Finding&) {
    throw;
  } catch (const std::exception& e) {
    throw Finding(std::string(what) + " threw " + type_name(typeid(e)) + ": " + e.what());
  } catch (...) {
    throw Finding(std::string(what) + " threw something that is not a std::exception");
  }
}

// Throws a Finding saying `what` when `condition` is false.
void require(bool condition, std::string_view what);

// Same dtype, shape and bytes (NaNs compare by their bits).
bool same_tensor(const Tensor& a, const Tensor& b);
bool same_tensors(const StateDict& a, const StateDict& b);
// Kind, step, microbatch, chunk, meta and tensors equal.
bool same_message(const Message& a, const Message& b);

// A file of this process for decoders that read paths, under $TMPDIR (run.sh points it at a
// scratch folder), and removed by the destructor.
class ScratchFile {
 public:
  ScratchFile(std::string_view tag, const uint8_t* data, size_t size);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace pipit::fuzz

#include "codec/atomic_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "codec/durable_fs.h"
#include "tensor/error.h"

namespace pipit {

void write_file_atomic(const std::string& path, const std::string& contents) {
  remove_stale_temporaries(path);
  // Until the rename the target is untouched, and each failing step removes the temporary.
  const NewFile temp = create_temp_file(path);
  finish_file(temp, contents);
  try {
    rename_path(temp.path, path);
  } catch (const Error&) {
    std::remove(temp.path.c_str());
    throw;
  }
  // The new contents are in place but not yet durable: a crash could still bring the old
  // file back, which the caller must hear about (it may be about to delete its source).
  try {
    fsync_directory(parent_directory(path));
  } catch (const Error& e) {
    throw Error("'" + path + "' was replaced but may not survive a crash: " + e.what());
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PIPIT_CHECK(in, "cannot open '", path, "'");
  std::ostringstream out;
  out << in.rdbuf();
  PIPIT_CHECK(!in.bad(), "cannot read '", path, "'");
  return out.str();
}

}  // namespace pipit

#include "codec/atomic_file.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "codec/durable_fs.h"
#include "tensor/error.h"

namespace pipit {

void write_file_atomic(const std::string& path, const std::string& contents,
                       const ByteProgress& on_progress) {
  remove_stale_temporaries(path);
  // Until the rename the target is untouched, and each failing step removes the temporary.
  const NewFile temp = create_temp_file(path);
  finish_file(temp, contents, on_progress);
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

std::string read_file(const std::string& path, const ByteProgress& on_progress) {
  std::ifstream in(path, std::ios::binary);
  PIPIT_CHECK(in, "cannot open '", path, "'");
  if (!on_progress) {
    std::ostringstream out;
    out << in.rdbuf();
    PIPIT_CHECK(!in.bad(), "cannot read '", path, "'");
    return out.str();
  }
  in.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(std::max<std::streamoff>(0, in.tellg()));
  in.seekg(0);
  std::string bytes(size, '\0');
  for (size_t done = 0; done < size;) {
    const size_t piece = std::min(kProgressPiece, size - done);
    in.read(bytes.data() + done, static_cast<std::streamsize>(piece));
    PIPIT_CHECK(in.gcount() == static_cast<std::streamsize>(piece), "cannot read '", path,
                "': it ended at byte ", done + static_cast<size_t>(in.gcount()), " of ", size);
    done += piece;
    on_progress(done, size);
  }
  return bytes;
}

}  // namespace pipit

#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "text/error.h"
#include "text/pretokenizer.h"

namespace pipit::text {
namespace {

// Pieces longer than this are not cached: they are rare, and would pin their memory.
constexpr size_t kMaxCachedPiece = 64;
// Past this many entries the cache stops growing (HF tokenizers caps its cache the same way):
// a stream of distinct pieces must not grow memory without bound.
constexpr size_t kMaxCacheEntries = 1 << 18;

}  // namespace

struct Tokenizer::State {
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  State(const BpeModel& model, std::string_view source) : encoder(model, source) {}
  BpeEncoder encoder;
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> ids;  // by bytes
  std::vector<std::pair<std::string, uint32_t>> specials;  // text, id; longest first
  std::mutex cache_mutex;
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> cache;
};

Tokenizer::Tokenizer(BpeModel model, std::string_view source)
    : model_(std::move(model)), state_(std::make_unique<State>(model_, source)) {
  for (uint32_t id = 0; id < model_.tokens.size(); ++id) state_->ids.emplace(model_.tokens[id], id);
  for (const uint32_t id : model_.specials) {
    if (id >= model_.tokens.size() || model_.tokens[id].empty()) {
      throw TextError(std::string(source) + ": special token id " + std::to_string(id) +
                      " is not a non-empty token");
    }
    state_->specials.emplace_back(model_.tokens[id], id);
  }
  // Where one special is a prefix of another at the same place, the longer one wins.
  std::stable_sort(state_->specials.begin(), state_->specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_directory(const std::string& dir,
                                    const std::vector<std::string>& specials) {
  const std::filesystem::path root(dir);
  if (std::filesystem::exists(root / "tokenizer.json")) {
    const std::string path = (root / "tokenizer.json").string();
    return Tokenizer(load_tokenizer_json(path), path);
  }
  const std::string vocab = (root / "vocab.json").string();
  return Tokenizer(load_vocab_merges(vocab, (root / "merges.txt").string(), specials), vocab);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  encode(text, ids);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  const auto& specials = state_->specials;
  if (specials.empty()) return encode_ordinary(text, out);
  // Each special's next occurrence at or after `pos`, found again only once passed, so that
  // the text is searched once per special rather than once per piece.
  std::vector<size_t> next(specials.size());
  for (size_t i = 0; i < specials.size(); ++i) next[i] = text.find(specials[i].first);
  for (size_t pos = 0;;) {
    size_t at = std::string_view::npos, which = 0;
    for (size_t i = 0; i < specials.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < pos)
        next[i] = text.find(specials[i].first, pos);
      if (next[i] < at) at = next[i], which = i;
    }
    encode_ordinary(text.substr(pos, at == std::string_view::npos ? at : at - pos), out);
    if (at == std::string_view::npos) return;
    out.push_back(specials[which].second);
    pos = at + specials[which].first.size();
  }
}

namespace {

bool visible_ascii(char c) {
  return c > ' ' && c < 0x7f;
}

// The first place at or after `from` where the text may be cut without changing its
// pre-tokens: just after a '\n' that stands alone between two visible ASCII characters (that
// '\n' is a pre-token of its own, and no special token holds one); the end when there is none.
size_t safe_cut(std::string_view text, size_t from) {
  for (size_t p = std::max<size_t>(from, 2); p < text.size(); ++p) {
    if (text[p - 1] == '\n' && visible_ascii(text[p - 2]) && visible_ascii(text[p])) return p;
  }
  return text.size();
}

}  // namespace

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out,
                       const std::function<void(size_t)>& on_progress, size_t chunk) const {
  for (size_t done = 0; done < text.size();) {
    const size_t cut = safe_cut(text, done + std::max<size_t>(chunk, 1));
    encode(text.substr(done, cut - done), out);
    done = cut;
    if (on_progress) on_progress(done);
  }
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const {
  pretokenize(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(state_->encoder.byte_id(static_cast<unsigned char>(piece[0])));
    return;
  }
  if (model_.ignore_merges) {
    if (const auto it = state_->ids.find(piece); it != state_->ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kMaxCachedPiece) return state_->encoder.encode(piece, out);
  {
    std::lock_guard lock(state_->cache_mutex);
    if (const auto it = state_->cache.find(piece); it != state_->cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t begin = out.size();
  state_->encoder.encode(piece, out);
  std::lock_guard lock(state_->cache_mutex);
  if (state_->cache.size() < kMaxCacheEntries) {
    state_->cache.emplace(std::string(piece),
                          std::vector<uint32_t>(out.begin() + begin, out.end()));
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= model_.tokens.size()) {
      throw TextError("decode: token id " + std::to_string(ids[i]) + " at position " +
                      std::to_string(i) + " is out of range (the vocabulary has " +
                      std::to_string(model_.tokens.size()) + " tokens)");
    }
    text += model_.tokens[ids[i]];
  }
  return text;
}

std::optional<uint32_t> Tokenizer::token_id(std::string_view bytes) const {
  const auto it = state_->ids.find(bytes);
  return it == state_->ids.end() ? std::nullopt : std::optional<uint32_t>(it->second);
}

}  // namespace pipit::text

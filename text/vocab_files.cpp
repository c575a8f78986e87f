#include "text/vocab_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/error.h"

namespace pipit::text {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw TextError(std::string(file) + ": " + what);
}

// Deeper nesting than these files ever have is refused before parsing: nlohmann's parser
// and destructor recurse per level, and a file of nested brackets would overflow the stack.
constexpr size_t kMaxNesting = 64;

void check_nesting(std::string_view text, std::string_view name) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      in_string = c != '"';
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting)
        fail(name, "JSON nested deeper than " + std::to_string(kMaxNesting));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

json parse_json(std::string_view text, std::string_view name) {
  check_nesting(text, name);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(name, std::string("not valid JSON: ") + e.what());
  }
}

// Spellings -> ids, and the model's tokens by id, from a {"spelling": id} object.
struct Vocabulary {
  std::unordered_map<std::string, uint32_t> ids;  // by spelling
  BpeModel model;
};

Vocabulary read_vocabulary(const json& object, const std::vector<std::string>& specials,
                           std::string_view name) {
  if (!object.is_object()) fail(name, "the vocabulary is not a JSON object");
  if (object.empty()) fail(name, "the vocabulary is empty");
  if (object.size() > (size_t{1} << 31)) fail(name, "the vocabulary has over 2^31 tokens");
  Vocabulary vocab;
  std::vector<std::optional<std::string>> by_id(object.size());
  std::vector<const std::string*> spelling_of(object.size());
  for (const auto& [spelling, value] : object.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= object.size()) {
      fail(name, "token '" + spelling + "' has id " + value.dump() + ", not one of 0.." +
                     std::to_string(object.size() - 1) + " (ids must be dense)");
    }
    const auto id = value.get<uint32_t>();
    if (by_id[id])
      fail(name, "tokens '" + *spelling_of[id] + "' and '" + spelling + "' share id " +
                     std::to_string(id));
    const bool special = std::find(specials.begin(), specials.end(), spelling) != specials.end();
    std::optional<std::string> bytes = spelling_to_bytes(spelling);
    if (!bytes && !special) {
      fail(name, "token '" + spelling + "' (id " + std::to_string(id) +
                     ") is not spelled in GPT-2's byte-level alphabet");
    }
    by_id[id] = special ? spelling : *bytes;
    const auto [it, fresh] = vocab.ids.emplace(spelling, id);
    spelling_of[id] = &it->first;
  }
  for (auto& bytes : by_id) vocab.model.tokens.push_back(std::move(*bytes));
  for (const std::string& special : specials) {
    const auto it = vocab.ids.find(special);
    if (it == vocab.ids.end()) fail(name, "special token '" + special + "' is not in it");
    vocab.model.specials.push_back(it->second);
  }
  return vocab;
}

uint32_t merge_part(const Vocabulary& vocab, const std::string& spelling, std::string_view where) {
  const auto it = vocab.ids.find(spelling);
  if (it == vocab.ids.end()) {
    fail(where, "the merge names '" + spelling + "', which is not in the vocabulary");
  }
  return it->second;
}

void add_merge(Vocabulary& vocab, const std::string& left, const std::string& right,
               std::string_view where) {
  const uint32_t l = merge_part(vocab, left, where);
  const uint32_t r = merge_part(vocab, right, where);
  const auto it = vocab.ids.find(left + right);
  if (it == vocab.ids.end()) {
    fail(where, "the merge '" + left + " " + right + "' makes '" + left + right +
                    "', which is not in the vocabulary (vocab and merges disagree)");
  }
  // A special token's bytes are its spelling, not the byte map's reading of it: one inside a
  // merge would decode to other bytes than the merge's parts.
  const auto& specials = vocab.model.specials;
  for (const uint32_t id : {l, r, it->second}) {
    if (std::find(specials.begin(), specials.end(), id) != specials.end()) {
      fail(where, "the merge '" + left + " " + right + "' names or makes a special token");
    }
  }
  vocab.model.merges.push_back({l, r, it->second});
}

void write_whole(const std::filesystem::path& path, const std::string& bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) fail(tmp.string(), "could not be written");
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) fail(path.string(), "could not be replaced: " + error.message());
}

BpeModel read_tokenizer_json(const json& root, std::string_view name) {
  const auto field = [&](const json& object, const char* key,
                         std::string_view path) -> const json& {
    if (!object.is_object() || !object.contains(key)) fail(name, "has no " + std::string(path));
    return object.at(key);
  };
  const json& model = field(root, "model", "\"model\"");
  if (field(model, "type", "model.type") != "BPE") {
    fail(name, "model.type is " + model.at("type").dump() + "; pipit reads BPE models only");
  }
  const json& pre = field(root, "pre_tokenizer", "\"pre_tokenizer\"");
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel" ||
      pre.value("add_prefix_space", true) || !pre.value("use_regex", true)) {
    fail(name, "pre_tokenizer is " + pre.dump() +
                   "; pipit implements ByteLevel with add_prefix_space false and use_regex true");
  }
  std::vector<std::string> specials;
  if (root.contains("added_tokens")) {
    const json& added = root.at("added_tokens");
    if (!added.is_array()) fail(name, "added_tokens is not an array");
    for (const json& token : added) {
      if (!token.is_object() || !token.contains("content") || !token.at("content").is_string()) {
        fail(name, "added token " + token.dump() + " has no string \"content\"");
      }
      if (token.value("special", false)) specials.push_back(token.at("content"));
    }
  }
  Vocabulary vocab = read_vocabulary(field(model, "vocab", "model.vocab"), specials, name);
  const json& merges = field(model, "merges", "model.merges");
  if (!merges.is_array()) fail(name, "model.merges is not an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    const std::string where = std::string(name) + ": model.merges[" + std::to_string(i) + "]";
    // Older files spell a merge "left right", newer ones ["left", "right"].
    if (merge.is_string()) {
      const std::string pair = merge;
      const size_t space = pair.find(' ');
      if (space == std::string::npos || pair.find(' ', space + 1) != std::string::npos) {
        fail(where, "expected two tokens separated by one space, got '" + pair + "'");
      }
      add_merge(vocab, pair.substr(0, space), pair.substr(space + 1), where);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      add_merge(vocab, merge[0], merge[1], where);
    } else {
      fail(where, "expected \"left right\" or [\"left\", \"right\"], got " + merge.dump());
    }
  }
  vocab.model.ignore_merges = model.value("ignore_merges", false);
  return std::move(vocab.model);
}

std::string spelling(const BpeModel& model, uint32_t id) {
  const bool special =
      std::find(model.specials.begin(), model.specials.end(), id) != model.specials.end();
  return special ? model.tokens[id] : bytes_to_spelling(model.tokens[id]);
}

}  // namespace

BpeModel parse_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                            const std::vector<std::string>& specials, std::string_view vocab_name,
                            std::string_view merges_name) {
  Vocabulary vocab = read_vocabulary(parse_json(vocab_json, vocab_name), specials, vocab_name);
  size_t line_number = 0;
  for (size_t begin = 0; begin < merges_txt.size();) {
    const size_t newline = std::min(merges_txt.find('\n', begin), merges_txt.size());
    std::string_view line = merges_txt.substr(begin, newline - begin);
    begin = newline + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const std::string where = std::string(merges_name) + ":" + std::to_string(line_number);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      fail(where, "expected two tokens separated by one space, got '" + std::string(line) + "'");
    }
    add_merge(vocab, std::string(line.substr(0, space)), std::string(line.substr(space + 1)),
              where);
  }
  return std::move(vocab.model);
}

BpeModel load_vocab_merges(const std::string& vocab_path, const std::string& merges_path,
                           const std::vector<std::string>& specials) {
  return parse_vocab_merges(read_text_file(vocab_path), read_text_file(merges_path), specials,
                            vocab_path, merges_path);
}

BpeModel parse_tokenizer_json(std::string_view text, std::string_view name) {
  // A field of the wrong JSON type (a number where a bool belongs) is a bad file too.
  try {
    return read_tokenizer_json(parse_json(text, name), name);
  } catch (const json::exception& e) {
    fail(name, std::string("unexpected JSON: ") + e.what());
  }
}

BpeModel load_tokenizer_json(const std::string& path) {
  return parse_tokenizer_json(read_text_file(path), path);
}

std::string format_vocab_json(const BpeModel& model) {
  // nlohmann's object sorts its keys; vocab.json lists tokens in id order, as HF writes it.
  std::string out = "{";
  for (uint32_t id = 0; id < model.tokens.size(); ++id) {
    // append, not operator+: GCC 12 misreports the latter here (-Wrestrict).
    if (id) out.append(",");
    out.append(json(spelling(model, id)).dump()).append(":").append(std::to_string(id));
  }
  return out + "}";
}

std::string format_merges_txt(const BpeModel& model) {
  std::string out = "#version: 0.2\n";
  for (const BpeMerge& merge : model.merges) {
    out.append(spelling(model, merge.left)).append(" ").append(spelling(model, merge.right));
    out.append("\n");
  }
  return out;
}

void save_vocab_merges(const BpeModel& model, const std::string& dir) {
  std::filesystem::create_directories(dir);
  write_whole(std::filesystem::path(dir) / "vocab.json", format_vocab_json(model));
  write_whole(std::filesystem::path(dir) / "merges.txt", format_merges_txt(model));
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) fail(path, "could not be read");
  return bytes.str();
}

}  // namespace pipit::text

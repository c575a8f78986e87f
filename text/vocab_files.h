#pragma once
// Reading and writing a byte-level BPE model in Hugging Face's and GPT-2's files:
// vocab.json ({"spelling": id, ...}) with merges.txt (an optional "#version" line, then one
// "left right" pair per line, in rank order), or one tokenizer.json (model type "BPE" with a
// ByteLevel pre-tokenizer). Spellings use GPT-2's byte-to-unicode map (byte_level.h).
//
// Everything is checked before a model is returned: ids dense and unique, every byte a token,
// every merge's parts and result in the vocabulary, special tokens present. A failure throws
// TextError naming the file (and line, token or id) at fault.
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe_model.h"

namespace pipit::text {

// <|endoftext|>, which GPT-2 and pipit's trainer put in the vocabulary.
inline const std::vector<std::string> kDefaultSpecials = {"<|endoftext|>"};

// `specials` must each be in the vocabulary; they may be spelled outside the byte map.
BpeModel parse_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                            const std::vector<std::string>& specials,
                            std::string_view vocab_name = "vocab.json",
                            std::string_view merges_name = "merges.txt");
BpeModel load_vocab_merges(const std::string& vocab_path, const std::string& merges_path,
                           const std::vector<std::string>& specials = kDefaultSpecials);

// Specials are the added tokens marked "special".
BpeModel parse_tokenizer_json(std::string_view text, std::string_view name = "tokenizer.json");
BpeModel load_tokenizer_json(const std::string& path);

// Writes DIR/vocab.json and DIR/merges.txt as Hugging Face's save_model does (vocabulary in
// id order, "#version: 0.2" first); each file is written whole under a temporary name first.
void save_vocab_merges(const BpeModel& model, const std::string& dir);
// The two files' contents, as save_vocab_merges writes them.
std::string format_vocab_json(const BpeModel& model);
std::string format_merges_txt(const BpeModel& model);

// A file's bytes; throws TextError naming it when it cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace pipit::text

// pipit-tokenizer: GPT-2 byte-level BPE from the command line (text/).
//   pipit-tokenizer train --vocab-size N --out DIR FILE        learn DIR/vocab.json + merges.txt
//   pipit-tokenizer encode --tokenizer DIR FILE OUT.tokens      text -> token file
//   pipit-tokenizer decode --tokenizer DIR FILE.tokens OUT.txt  token file -> text
// A tokenizer directory holds tokenizer.json, or vocab.json + merges.txt (Hugging Face's and
// GPT-2's files load as they are). Errors name the file at fault and exit with status 1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "support/flags.h"
#include "support/progress_line.h"
#include "text/bpe_trainer.h"
#include "text/error.h"
#include "text/token_file.h"
#include "text/tokenizer.h"

using namespace pipit::text;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void add_tokenizer_flag(pipit::support::Flags& flags) {
  flags.add_required("tokenizer", "directory holding tokenizer.json, or vocab.json + merges.txt");
}

int train(int argc, char** argv) {
  pipit::support::Flags flags(
      "pipit-tokenizer train",
      "Learns a byte-level BPE from FILE as Hugging Face tokenizers' "
      "ByteLevel BPE trainer does; writes DIR/vocab.json and DIR/merges.txt.");
  flags.add_required("vocab-size",
                     "tokens in the vocabulary: <|endoftext|>, the 256 bytes, merges");
  flags.add_required("out", "directory to write vocab.json and merges.txt into");
  flags.add("min-frequency", "0", "never merge a pair seen fewer times than this");
  flags.add_positional("FILE", "the training text");
  flags.parse(argc, argv);
  const auto start = std::chrono::steady_clock::now();
  BpeTrainer trainer({.vocab_size = static_cast<size_t>(flags.integer("vocab-size", 258)),
                      .min_frequency = static_cast<uint64_t>(flags.integer("min-frequency", 0))});
  trainer.add_file(flags.positional("FILE"));
  pipit::support::ProgressLine progress("train", static_cast<double>(flags.integer("vocab-size")),
                                        "tokens");
  const BpeModel model =
      trainer.train([&](size_t tokens, size_t) { progress.update(static_cast<double>(tokens)); });
  progress.finish();
  save_vocab_merges(model, flags.str("out"));
  std::printf("%zu tokens (%zu merges) in %.2f s -> %s\n", model.tokens.size(), model.merges.size(),
              seconds_since(start), flags.str("out").c_str());
  return 0;
}

int encode(int argc, char** argv) {
  pipit::support::Flags flags("pipit-tokenizer encode",
                              "Encodes FILE (read whole, any bytes) into the token file OUT.");
  add_tokenizer_flag(flags);
  flags.add("dtype", "auto", "id width: uint16, uint32, or auto (uint16 when the vocabulary fits)");
  flags.add_positional("FILE", "the text to encode");
  flags.add_positional("OUT", "the token file to write");
  flags.parse(argc, argv);
  const Tokenizer tokenizer = Tokenizer::from_directory(flags.str("tokenizer"));
  const std::string dtype = flags.choice("dtype", {"auto", "uint16", "uint32"});
  const TokenWidth width = dtype == "uint16"   ? TokenWidth::u16
                           : dtype == "uint32" ? TokenWidth::u32
                                               : token_width_for(tokenizer.vocab_size());
  const std::string text = read_text_file(flags.positional("FILE"));
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint32_t> ids;
  pipit::support::ProgressLine progress("encode", static_cast<double>(text.size()), "MB", 1e6);
  tokenizer.encode(text, ids, [&](size_t bytes) { progress.update(static_cast<double>(bytes)); });
  progress.finish();
  const double seconds = seconds_since(start);
  TokenFileWriter writer(flags.positional("OUT"), width);
  writer.write(ids);
  writer.close();
  std::printf("%zu bytes -> %zu tokens (%.3f bytes/token) in %.3f s (%.2f MB/s) -> %s\n",
              text.size(), ids.size(),
              double(text.size()) / double(std::max<size_t>(1, ids.size())), seconds,
              double(text.size()) / 1e6 / seconds, flags.positional("OUT").c_str());
  return 0;
}

int decode(int argc, char** argv) {
  pipit::support::Flags flags("pipit-tokenizer decode", "Decodes the token file FILE into OUT.");
  add_tokenizer_flag(flags);
  flags.add_positional("FILE", "the token file to decode");
  flags.add_positional("OUT", "the text file to write");
  flags.parse(argc, argv);
  const Tokenizer tokenizer = Tokenizer::from_directory(flags.str("tokenizer"));
  TokenFileReader reader(flags.positional("FILE"), tokenizer.vocab_size());
  std::ofstream out(flags.positional("OUT"), std::ios::binary | std::ios::trunc);
  if (!out) throw TextError(flags.positional("OUT") + ": cannot be created");
  std::vector<uint32_t> ids(1 << 16);
  while (const size_t n = reader.read(ids)) {
    const std::string text = tokenizer.decode(std::span(ids).first(n));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  out.close();
  if (!out) throw TextError(flags.positional("OUT") + ": could not be written");
  std::printf("%llu tokens -> %s\n", static_cast<unsigned long long>(reader.header().count),
              flags.positional("OUT").c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pipit::support::Flags flags("pipit-tokenizer",
                              "GPT-2 byte-level BPE: trains one, encodes text into a token file, "
                              "decodes a token file (pipit-tokenizer COMMAND --help lists each "
                              "command's flags).");
  flags.add_positional("COMMAND", "train, encode or decode");
  // Only the command: its flags follow it, for its own parser.
  flags.parse(std::min(argc, 2), argv);
  const std::string command = flags.positional("COMMAND");
  try {
    if (command == "train") return train(argc - 1, argv + 1);
    if (command == "encode") return encode(argc - 1, argv + 1);
    if (command == "decode") return decode(argc - 1, argv + 1);
  } catch (const TextError& e) {
    std::fprintf(stderr, "pipit-tokenizer %s: %s\n", command.c_str(), e.what());
    return 1;
  }
  flags.fail("unknown command '" + command + "'");
}

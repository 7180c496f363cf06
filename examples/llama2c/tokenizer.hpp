// The llama2.c BPE tokenizer (tokenizer.bin format), as run.c implements it: UTF-8 code
// points looked up whole, unknown ones as byte tokens (<0xXX>, id = byte + 3), then the
// pair with the best merge score merged repeatedly until no pair is in the vocabulary.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llama2c {

class tokenizer {
 public:
  static constexpr int kBos = 1;
  static constexpr int kEos = 2;

  /// Reads tokenizer.bin: int32 max_token_length, then per token float32 score, int32
  /// length, bytes. Throws std::runtime_error on a short or malformed file.
  tokenizer(const std::string& path, int vocab_size) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open tokenizer " + path);
    std::int32_t max_len = 0;
    if (!f.read(reinterpret_cast<char*>(&max_len), 4) || max_len <= 0)
      throw std::runtime_error(path + ": bad header");
    vocab_.resize(std::size_t(vocab_size));
    scores_.resize(std::size_t(vocab_size));
    for (int i = 0; i < vocab_size; ++i) {
      float score = 0.0f;
      std::int32_t len = 0;
      if (!f.read(reinterpret_cast<char*>(&score), 4) ||
          !f.read(reinterpret_cast<char*>(&len), 4) || len < 0 || len > 1024)
        throw std::runtime_error(path + ": truncated at token " + std::to_string(i) +
                                 " (does its vocabulary match the model's?)");
      std::string s(std::size_t(len), '\0');
      if (!f.read(s.data(), len)) throw std::runtime_error(path + ": truncated");
      scores_[std::size_t(i)] = score;
      vocab_[std::size_t(i)] = s;
      lookup_.emplace(s, i);  // first id wins, as run.c's bsearch over unique strings
    }
  }

  int vocab_size() const noexcept { return int(vocab_.size()); }

  /// run.c's encode(): BOS, the dummy-prefix space, code points, then BPE merges.
  std::vector<int> encode(std::string_view text, bool bos = true) const {
    std::vector<int> tokens;
    if (bos) tokens.push_back(kBos);
    if (!text.empty()) tokens.push_back(id_of(" "));
    std::string cp;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if ((c & 0xC0) != 0x80) cp.clear();  // not a continuation byte: a new code point
      cp.push_back(char(c));
      const bool next_continues =
          i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
      if (next_continues && cp.size() < 4) continue;
      const int id = find(cp);
      if (id >= 0) {
        tokens.push_back(id);
      } else {
        for (unsigned char b : cp) tokens.push_back(int(b) + 3);  // byte fallback
      }
      cp.clear();
    }
    // Merge the best-scoring adjacent pair until none is in the vocabulary.
    std::string pair;
    for (;;) {
      float best_score = -1e10f;
      int best_id = -1;
      std::size_t best_idx = 0;
      for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
        pair = vocab_[std::size_t(tokens[i])];
        pair += vocab_[std::size_t(tokens[i + 1])];
        const int id = find(pair);
        if (id >= 0 && scores_[std::size_t(id)] > best_score) {
          best_score = scores_[std::size_t(id)];
          best_id = id;
          best_idx = i;
        }
      }
      if (best_id < 0) break;
      tokens[best_idx] = best_id;
      tokens.erase(tokens.begin() + std::ptrdiff_t(best_idx) + 1);
    }
    return tokens;
  }

  /// run.c's decode(): the piece of `token`, without the leading space after BOS, with
  /// byte tokens turned back into their byte.
  std::string decode(int prev, int token) const {
    std::string piece = vocab_.at(std::size_t(token));
    if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    unsigned byte = 0;
    if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1)
      piece = std::string(1, char(byte));
    return piece;
  }

 private:
  int find(const std::string& s) const {
    const auto it = lookup_.find(s);
    return it == lookup_.end() ? -1 : it->second;
  }
  int id_of(const std::string& s) const {
    const int id = find(s);
    if (id < 0) throw std::runtime_error("tokenizer has no token for '" + s + "'");
    return id;
  }

  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
};

}  // namespace llama2c

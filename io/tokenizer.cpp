#include "io/tokenizer.h"

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/bytes.h"
#include "io/file_util.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/sp_tokenizer.h"
#include "io/spm_tokenizer.h"

namespace rlhf::io {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, bool add_bos,
                                           bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (add_bos) ids.push_back(kBos);
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  if (add_eos) ids.push_back(kEos);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    RLHF_CHECK(id >= 0 && id < kVocabSize,
               "token id {} at position {} is outside the byte tokenizer's vocabulary [0, {})", id,
               i, kVocabSize);
    if (id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (!skip_special_tokens) {
      out += id == kBos ? "<s>" : id == kEos ? "</s>" : "<pad>";
    }
  }
  return out;
}

namespace {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> tokenizer_from_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const Blob blob = map_file(path);
  const std::string_view head = blob.view().substr(0, 64);
  const size_t first = head.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && head[first] == '{') return load_hf_tokenizer(path);
  if (blob.size >= 4 && std::memcmp(blob.data, "GGUF", 4) == 0) {
    const GgufFile f = parse_gguf(blob);
    std::unique_ptr<Tokenizer> t = load_gguf_tokenizer(f);
    RLHF_CHECK(t != nullptr, "{}: the GGUF file carries no tokenizer (no tokenizer.ggml.tokens)",
               path);
    return t;
  }
  if (fs::path(path).extension() == ".model")
    return load_sentencepiece(std::string(blob.view()), name, path);
  return load_llama2c_tokenizer(blob);
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (fs::is_directory(spec)) {
    for (const char* name :
         {"tokenizer.json", "tokenizer.model", "tokenizer.bin", "tokenizer.gguf"}) {
      const fs::path p = fs::path(spec) / name;
      if (fs::is_regular_file(p)) return tokenizer_from_file(p.string());
    }
    RLHF_FAIL(
        "{}: no tokenizer in this folder (looked for tokenizer.json, tokenizer.model, "
        "tokenizer.bin, tokenizer.gguf)\nhint: name the tokenizer file with --tokenizer",
        spec);
  }
  if (fs::exists(spec)) return tokenizer_from_file(spec);
  RLHF_FAIL(
      "unknown tokenizer '{}': not a file or folder\nhint: available: byte, or the path of a "
      "tokenizer.json, tokenizer.model (SentencePiece), llama2.c tokenizer.bin, a GGUF file, or a "
      "folder holding one",
      spec);
}

std::unique_ptr<Tokenizer> make_tokenizer_from_files(const std::string& kind,
                                                     const std::vector<TokenizerFile>& files,
                                                     const std::string& source) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  RLHF_CHECK(!files.empty(), "{}: tokenizer of kind '{}' without files", source, kind);
  if (kind == "hf") return hf_tokenizer_from_files(files, source);
  const TokenizerFile& f = files.front();
  const std::string where = source + "/" + f.name;
  if (kind == "llama2c") return load_llama2c_tokenizer(blob_from_string(f.bytes, where));
  if (kind == "sentencepiece") return load_sentencepiece(f.bytes, f.name, where);
  if (kind == "gguf") {
    const GgufFile g = parse_gguf(blob_from_string(f.bytes, where));
    std::unique_ptr<Tokenizer> t = load_gguf_tokenizer(g);
    RLHF_CHECK(t != nullptr, "{}: no tokenizer.ggml.tokens", where);
    return t;
  }
  RLHF_FAIL("{}: unknown tokenizer kind '{}'\nhint: byte, hf, llama2c, sentencepiece or gguf",
            source, kind);
}

}  // namespace rlhf::io

#include "io/tokenizer.h"

#include "core/error.h"

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

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  RLHF_FAIL("unknown tokenizer '{}'\nhint: available: byte", spec);
}

}  // namespace rlhf::io

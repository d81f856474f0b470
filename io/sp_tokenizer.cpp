#include "io/sp_tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "io/text_util.h"

#ifdef RLHF_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace rlhf::io {

bool sentencepiece_available() {
#ifdef RLHF_HAVE_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

#ifdef RLHF_HAVE_SENTENCEPIECE

namespace {

constexpr const char* kSpaceSymbol = "\xE2\x96\x81";

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& bytes, const std::string& name,
                         const std::string& source)
      : name_(name), bytes_(bytes) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    RLHF_CHECK(status.ok(), "{}: not a SentencePiece model: {}", source, status.ToString());
    const int n = sp_.GetPieceSize();
    RLHF_CHECK(n > 0, "{}: SentencePiece model with an empty vocabulary", source);
    for (int i = 0; i < n; ++i)
      if (sp_.IsControl(i) || sp_.IsUnknown(i))
        if (!sp_.IdToPiece(i).empty()) specials_.emplace_back(sp_.IdToPiece(i), i);
    std::stable_sort(specials_.begin(), specials_.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    label_ = fmt::format("SentencePiece {} (vocab {})", name_, n);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override {
    std::vector<int32_t> out;
    if (add_bos && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    std::vector<int> ids;
    for (const TextOrToken& seg : split_on_special_tokens(text, specials_)) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
        continue;
      }
      ids.clear();
      const auto status = sp_.Encode(seg.text, &ids);
      RLHF_CHECK(status.ok(), "SentencePiece encode failed: {}", status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (add_eos && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    const int n = sp_.GetPieceSize();
    std::string out;
    std::vector<int> run;
    bool emitted = false;
    auto flush = [&] {
      if (run.empty()) return;
      std::string s;
      const auto status = sp_.Decode(run, &s);
      RLHF_CHECK(status.ok(), "SentencePiece decode failed: {}", status.ToString());
      // SentencePiece drops the leading '▁' of the text it decodes; keep it inside a sequence.
      if (emitted && sp_.IdToPiece(run.front()).rfind(kSpaceSymbol, 0) == 0) out += ' ';
      out += s;
      emitted = true;
      run.clear();
    };
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      RLHF_CHECK(id >= 0 && id < n, "token id {} at position {} is outside the vocabulary [0, {})",
                 id, i, n);
      if (is_special(id)) {
        if (skip_special_tokens) continue;
        flush();
        out += sp_.IdToPiece(id);
        emitted = true;
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }

  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t pad_id() const override { return sp_.pad_id() >= 0 ? sp_.pad_id() : sp_.unk_id(); }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < sp_.GetPieceSize() && (sp_.IsControl(id) || sp_.IsUnknown(id));
  }
  std::string name() const override { return label_; }
  std::string kind() const override { return "sentencepiece"; }
  std::vector<TokenizerFile> files() const override { return {{name_, bytes_}}; }
  int32_t token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    // PieceToId answers unk for unknown pieces: only a real match counts.
    return id >= 0 && sp_.IdToPiece(id) == token ? id : -1;
  }
  std::string id_to_token(int32_t id) const override {
    RLHF_CHECK(id >= 0 && id < sp_.GetPieceSize(), "token id {} is outside the vocabulary [0, {})",
               id, sp_.GetPieceSize());
    return sp_.IdToPiece(id);
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string name_, bytes_, label_;
  std::vector<std::pair<std::string, int32_t>> specials_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& bytes, const std::string& name,
                                              const std::string& source) {
  return std::make_unique<SentencePieceTokenizer>(bytes, name, source);
}

#else

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string&, const std::string&,
                                              const std::string& source) {
  RLHF_FAIL(
      "{}: this build has no SentencePiece\nhint: install libsentencepiece-dev "
      "(scripts/install-deps.sh) and rebuild, or use the model's tokenizer.json",
      source);
}

#endif

}  // namespace rlhf::io

#include "io/sp_tokenizer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/text_util.h"

#ifdef RLHF_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace rlhf::io {

namespace {
constexpr const char* kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁'
}  // namespace

bool sentencepiece_available() {
#ifdef RLHF_HAVE_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

#ifdef RLHF_HAVE_SENTENCEPIECE

namespace {

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

#endif

// --- reading the model proto for export ------------------------------------------------------

namespace {

// A minimal protobuf reader: the fields of one message, by number (varints, fixed32, bytes).
struct ProtoField {
  uint32_t number = 0;
  uint64_t varint = 0;
  uint32_t fixed32 = 0;
  std::string_view bytes;
};

std::vector<ProtoField> proto_fields(std::string_view msg, const std::string& where) {
  std::vector<ProtoField> out;
  size_t i = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      RLHF_CHECK(i < msg.size(), "{}: truncated SentencePiece model", where);
      const auto b = static_cast<unsigned char>(msg[i++]);
      v |= uint64_t(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    RLHF_FAIL("{}: corrupt SentencePiece model (varint too long)", where);
  };
  while (i < msg.size()) {
    const uint64_t key = varint();
    ProtoField f;
    f.number = static_cast<uint32_t>(key >> 3);
    switch (key & 7) {
      case 0:
        f.varint = varint();
        break;
      case 1:
        RLHF_CHECK(i + 8 <= msg.size(), "{}: truncated SentencePiece model", where);
        i += 8;
        break;
      case 2: {
        const uint64_t len = varint();
        RLHF_CHECK(len <= msg.size() - i, "{}: truncated SentencePiece model", where);
        f.bytes = msg.substr(i, len);
        i += len;
        break;
      }
      case 5:
        RLHF_CHECK(i + 4 <= msg.size(), "{}: truncated SentencePiece model", where);
        std::memcpy(&f.fixed32, msg.data() + i, 4);
        i += 4;
        break;
      default:
        RLHF_FAIL("{}: corrupt SentencePiece model (wire type {})", where, key & 7);
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace

ScoreVocab sentencepiece_score_vocab(const Tokenizer& t) {
  RLHF_CHECK(t.kind() == "sentencepiece" && !t.files().empty(),
             "tokenizer {} is not a SentencePiece model", t.name());
  const TokenizerFile file = t.files().front();
  const std::string where = file.name;
  ScoreVocab v;
  int64_t model_type = 1;  // UNIGRAM, the proto's default
  bool dummy_prefix = true, extra_spaces = true;
  std::string norm_name;
  for (const ProtoField& f : proto_fields(file.bytes, where)) {
    if (f.number == 1) {  // SentencePiece {piece = 1, score = 2, type = 3}
      std::string piece;
      float score = 0;
      int64_t type = 1;
      for (const ProtoField& g : proto_fields(f.bytes, where)) {
        if (g.number == 1) piece = std::string(g.bytes);
        if (g.number == 2) std::memcpy(&score, &g.fixed32, 4);
        if (g.number == 3) type = static_cast<int64_t>(g.varint);
      }
      RLHF_CHECK(type >= 1 && type <= 6, "{}: piece {} has type {}", where, v.pieces.size(), type);
      std::string spaced;  // '▁' → ' ', as ScoreVocab spells pieces
      for (size_t k = 0; k < piece.size();) {
        if (piece.compare(k, 3, kSpaceSymbol) == 0) {
          spaced += ' ';
          k += 3;
        } else {
          spaced += piece[k++];
        }
      }
      v.pieces.push_back(std::move(spaced));
      v.scores.push_back(score);
      v.types.push_back(static_cast<TokenType>(type));
    } else if (f.number == 2) {  // TrainerSpec: model_type = 3
      for (const ProtoField& g : proto_fields(f.bytes, where))
        if (g.number == 3) model_type = static_cast<int64_t>(g.varint);
    } else if (f.number == 3) {  // NormalizerSpec
      for (const ProtoField& g : proto_fields(f.bytes, where)) {
        if (g.number == 1) norm_name = std::string(g.bytes);
        if (g.number == 3) dummy_prefix = g.varint != 0;
        if (g.number == 4) extra_spaces = g.varint != 0;
      }
    }
  }
  RLHF_CHECK(model_type == 2,
             "{} (tokenizer kind 'sentencepiece'): model type {} cannot be written as a BPE "
             "tokenizer.json or GGUF vocabulary (only BPE models can)",
             where, model_type == 1 ? "unigram" : std::to_string(model_type));
  RLHF_CHECK((norm_name.empty() || norm_name == "identity") && !extra_spaces,
             "{} (tokenizer kind 'sentencepiece'): the normalizer ('{}', remove_extra_whitespaces "
             "{}) has no tokenizer.json equivalent here (only 'identity' without whitespace "
             "removal, as Llama's, has)",
             where, norm_name, extra_spaces);
  RLHF_CHECK(static_cast<int64_t>(v.pieces.size()) == t.vocab_size(),
             "{}: {} pieces in the proto, {} in the tokenizer", where, v.pieces.size(),
             t.vocab_size());
  v.add_space_prefix = dummy_prefix;
  v.bos_id = t.bos_id();
  v.eos_id = t.eos_id();
  v.unk_id = -1;
  for (size_t i = 0; i < v.types.size(); ++i)
    if (v.types[i] == TokenType::kUnknown && v.unk_id < 0) v.unk_id = static_cast<int32_t>(i);
  v.pad_id = t.pad_id() != v.unk_id ? t.pad_id() : -1;
  return v;
}

#ifndef RLHF_HAVE_SENTENCEPIECE

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string&, const std::string&,
                                              const std::string& source) {
  RLHF_FAIL(
      "{}: this build has no SentencePiece\nhint: install libsentencepiece-dev "
      "(scripts/install-deps.sh) and rebuild, or use the model's tokenizer.json",
      source);
}

#endif

}  // namespace rlhf::io

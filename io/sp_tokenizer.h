// SentencePiece tokenizer.model files through Debian's libsentencepiece (the reference
// implementation, not a re-implementation). Available when the build found the library
// (RLHF_HAVE_SENTENCEPIECE); otherwise loading one is an rlhf::Error with a hint.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/spm_tokenizer.h"
#include "io/tokenizer.h"

namespace rlhf::io {

/// True when this build links libsentencepiece.
bool sentencepiece_available();

/// Loads a serialized SentencePiece model (`bytes`, the content of a tokenizer.model; `name` its
/// file name, `source` for messages). Encoding splits the text on control and unknown pieces
/// written in it ("<s>", "</s>", ...), which become their ids as in Hugging Face's Llama
/// tokenizer; SentencePiece encodes the text between them (each stretch with its dummy prefix).
/// Decoding is SentencePiece's; special tokens are rendered by their piece when not skipped.
/// pad_id() is the model's pad piece, else unk. Throws rlhf::Error when the bytes are not a
/// SentencePiece model.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& bytes, const std::string& name,
                                              const std::string& source);

/// The vocabulary of a SentencePiece tokenizer (kind "sentencepiece"), read from its model proto
/// (not through the library, so it works in any build): pieces with ' ' for '▁', scores, types,
/// BOS/EOS/UNK/PAD ids and the dummy prefix; for writing it as a tokenizer.json or GGUF
/// vocabulary. Throws rlhf::Error naming the file for a model that such a BPE cannot reproduce:
/// a unigram model, or a normalizer other than 'identity' without whitespace removal (Llama's).
ScoreVocab sentencepiece_score_vocab(const Tokenizer& t);

}  // namespace rlhf::io

// A model's tokenizer written into the formats `rlhf export` produces:
//  - Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) that transformers'
//    AutoTokenizer loads and that tokenize as rlhf does;
//  - GGUF metadata (tokenizer.ggml.*, tokenizer.chat_template) that llama.cpp, the gguf Python
//    package and rlhf read.
// Every tokenizer kind (Tokenizer::kind()) has a form:
//   hf             its own tokenizer.json (+ tokenizer_config.json / special_tokens_map.json, a
//                  generated tokenizer_config.json when it came without one);
//   gguf (gpt2)    the byte-level BPE its GGUF vocabulary describes (tokens, merges, the split
//                  regex of tokenizer.ggml.pre);
//   gguf (llama), llama2c, sentencepiece
//                  a score-based SentencePiece BPE written as transformers' LlamaConverter does:
//                  BPE with byte_fallback, merges derived from the scores (every split of a piece
//                  into two pieces, by the piece's score, highest first), a normalizer that
//                  prepends '▁' and maps ' ' to '▁' (each stretch of text between special tokens
//                  gets its dummy prefix, as in rlhf), <s> put in front by the post-processor;
//   byte           a BPE vocabulary of the 256 byte tokens <0x00>..<0xFF> (ids 0..255, reached
//                  through byte_fallback with no merges) and <s> 256, </s> 257, <pad> 258, with
//                  split_special_tokens so that "<s>" written in a text stays bytes, as in rlhf.
// Both writers check their output: the written tokenizer is loaded back and must give the source
// tokenizer's ids on tokenizer_probe_text; a difference is an rlhf::Error for the Hugging Face
// files, and for GGUF the exact tokenizer.json is embedded as tokenizer.huggingface.json (which
// rlhf reads before the tokenizer.ggml.* keys) with a warning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace rlhf::io {

class GgufWriter;

/// The Hugging Face tokenizer files of `t`: tokenizer.json, tokenizer_config.json (tokenizer_class
/// PreTrainedTokenizerFast, bos/eos/pad/unk tokens, add_bos_token, add_eos_token, chat_template
/// from t.chat_template(), model_max_length = `model_max_length`), and special_tokens_map.json
/// when the source tokenizer had one. Throws rlhf::Error naming the tokenizer kind when it cannot
/// be written (e.g. a SentencePiece unigram model) or the written files would tokenize the probe
/// text differently.
std::vector<TokenizerFile> hf_tokenizer_files(const Tokenizer& t, int64_t model_max_length);

/// Adds `t` to a GGUF file as tokenizer.ggml.model ("gpt2" or "llama"), tokens, scores,
/// token_type, merges (gpt2), bos/eos/unknown/padding token ids, add_bos_token/add_eos_token,
/// pre (gpt2: "gpt-2", "llama-bpe", "qwen2" or "smollm"), add_space_prefix (llama) and
/// tokenizer.chat_template. A vocabulary smaller than the model's (`model_vocab_size`) is padded
/// with unused tokens "<rlhf_unused_N>" (llama.cpp needs one token per embedding row). Throws
/// rlhf::Error naming the kind when `t` cannot be written at all.
void write_gguf_tokenizer(GgufWriter& w, const Tokenizer& t, int64_t model_vocab_size);

/// A text that exercises a tokenizer: ASCII words and punctuation, runs of spaces, tabs and
/// newlines, digits, accented letters, CJK, an emoji, and `t`'s BOS/EOS token names written in
/// the text.
std::string tokenizer_probe_text(const Tokenizer& t);

}  // namespace rlhf::io

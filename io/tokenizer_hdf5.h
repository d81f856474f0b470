// A tokenizer stored inside our HDF5 checkpoint, so that a checkpoint made from a real model keeps
// its tokenizer:
//   /tokenizer               group, attribute kind = Tokenizer::kind() ("hf", "llama2c", ...)
//   /tokenizer/<file name>   uint8 dataset: the bytes of each file of Tokenizer::files()
#pragma once

#include <memory>

#include "io/hdf5_ckpt.h"
#include "io/tokenizer.h"

namespace rlhf::io {

/// Writes `tokenizer` under /tokenizer (kind "byte" stores no files). Throws rlhf::Error for a file
/// name that cannot be an HDF5 name (empty, '/', '.', '..').
void write_tokenizer_hdf5(CheckpointWriter& writer, const Tokenizer& tokenizer);

/// The tokenizer stored in the checkpoint, or null when it has no /tokenizer group. Errors (a
/// corrupt dataset, an unknown kind) name the file.
std::unique_ptr<Tokenizer> read_tokenizer_hdf5(const CheckpointReader& reader);

}  // namespace rlhf::io

// Whole-file verification of an HDF5 checkpoint: every dataset read in full, so every
// checksummed chunk (our datasets are written with the Fletcher32 filter) is checked.
#pragma once

#include <cstdint>
#include <string>

namespace rlhf::io {

/// Reads every dataset of the HDF5 file at `path` (any type, any shape, chunk by chunk through
/// HDF5's filter pipeline) and returns the bytes read. Throws rlhf::Error naming the file and the
/// first dataset that cannot be read — a checksum mismatch (a flipped bit), a truncated chunk, an
/// unreadable object.
int64_t verify_hdf5_file(const std::string& path);

}  // namespace rlhf::io

#include "io/tokenizer_hdf5.h"

#include "core/error.h"

namespace rlhf::io {

void write_tokenizer_hdf5(CheckpointWriter& w, const Tokenizer& t) {
  w.create_group("/tokenizer");
  w.write_string_attr("/tokenizer", "kind", t.kind());
  w.write_string_attr("/tokenizer", "name", t.name());
  for (const TokenizerFile& f : t.files()) {
    RLHF_CHECK(
        !f.name.empty() && f.name.find('/') == std::string::npos && f.name != "." && f.name != "..",
        "{}: tokenizer file name '{}' cannot be stored", w.path(), f.name);
    w.write_dataset<uint8_t>("/tokenizer/" + f.name,
                             reinterpret_cast<const uint8_t*>(f.bytes.data()),
                             {static_cast<int64_t>(f.bytes.size())});
  }
}

std::unique_ptr<Tokenizer> read_tokenizer_hdf5(const CheckpointReader& r) {
  if (!r.exists("/tokenizer")) return nullptr;
  const std::string kind = r.read_string_attr("/tokenizer", "kind");
  std::vector<TokenizerFile> files;
  for (const std::string& name : r.list_datasets("/tokenizer")) {
    const std::vector<uint8_t> bytes = r.read_dataset_vector<uint8_t>("/tokenizer/" + name);
    files.push_back({name, std::string(bytes.begin(), bytes.end())});
  }
  return make_tokenizer_from_files(kind, files, r.path() + ":/tokenizer");
}

}  // namespace rlhf::io

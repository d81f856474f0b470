// Model config files: HF config.json or a TOML file with the same keys (examples/models/*.toml).
#pragma once

#include <string>

#include "model/config.h"

namespace rlhf::io {

/// Loads and validates a model config from `path`:
///  - `.json`: a HF config.json (nlohmann), read leniently (model::ConfigKeys::kHuggingFace): the
///    file may be the config.json of a Hugging Face folder, as transformers v4 or v5 writes it;
///    keys ModelConfig does not know are ignored, keys that change the computation in an
///    unsupported way (rope type, active sliding window, mlp_bias, hidden_act) are refused by
///    name. A syntax error reads "<file>:<line>:<column>: malformed JSON: <message>";
///  - `.toml`: a model config written by hand, read strictly (model::ConfigKeys::kStrict): the HF
///    key names (toml++), flat `key = value` pairs plus an optional `[rope_scaling]` table; a
///    syntax error reads "<file>:<line>:<column>: TOML parse error: <message>"; a key that
///    ModelConfig::from_json rejects (unknown key — a typo —, wrong type, invalid or unsupported
///    value) reads "<file>:<line>:<column>: <message>" with the position of that key (of the
///    table's name in its `[rope_scaling]` header for a key inside the table).
/// Other extensions, a missing file ("cannot open <file>: <strerror>") and invalid configs throw
/// rlhf::Error.
model::ModelConfig load_model_config_file(const std::string& path);

}  // namespace rlhf::io

// Model config files: HF config.json or a TOML file with the same keys (examples/models/*.toml).
#pragma once

#include <string>

#include "model/config.h"

namespace rlhf::io {

/// Loads and validates a model config from `path`:
///  - `.json`: HF config.json (nlohmann); a syntax error reads "<file>:<line>:<column>: malformed
///    JSON: <message>";
///  - `.toml`: flat `key = value` pairs with the HF names (toml++); a syntax error reads
///    "<file>:<line>:<column>: TOML parse error: <message>"; a key that ModelConfig::from_json
///    rejects (unknown key, wrong type, invalid value) reads "<file>:<line>:<column>: <message>"
///    with the position of that key.
/// Other extensions, a missing file ("cannot open <file>: <strerror>") and invalid configs throw
/// rlhf::Error.
model::ModelConfig load_model_config_file(const std::string& path);

}  // namespace rlhf::io

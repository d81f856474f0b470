#include "rl/environment.h"

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "io/text_util.h"
#include "rl/env_command.h"
#include "rl/subprocess.h"

namespace rlhf::rl {

std::unique_ptr<Environment> make_environment(const std::string& spec, double timeout_s) {
  RLHF_CHECK(!io::trim_whitespace(spec).empty(), "--env_command is empty");
  if (spec.rfind("builtin:", 0) == 0) {
    RLHF_CHECK(spec == "builtin:toy",
               "--env_command {}: unknown built-in environment\nhint: the built-in one is "
               "builtin:toy; anything else is run as a program",
               spec);
    return std::make_unique<ToyEnvironment>();
  }
  return std::make_unique<CommandEnvironment>(spec, timeout_s);
}

std::string env_query_line(const EnvQuery& q) {
  const nlohmann::ordered_json j = {{"id", q.id},     {"turn", q.turn},     {"prompt", q.prompt},
                                    {"text", q.text}, {"action", q.action}, {"label", q.label},
                                    {"eos", q.eos}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

EnvAnswer parse_env_answer(std::string_view line, const std::string& program, int64_t line_no,
                           const std::string& expected_id) {
  constexpr const char* kHint =
      "hint: the program must answer each request line with one line holding a JSON object "
      "{\"observation\": str, \"done\": bool, \"reward\": number (optional)}; write logs to "
      "stderr";
  const std::string quoted = subprocess::quote_tail(line.substr(0, 200), 200);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    RLHF_FAIL("--env_command '{}': answer {} is not JSON: '{}'\n{}", program, line_no, quoted,
              kHint);
  }
  RLHF_CHECK(j.is_object(), "--env_command '{}': answer {} is not a JSON object: '{}'\n{}", program,
             line_no, quoted, kHint);
  if (auto it = j.find("id"); it != j.end() && !it->is_null() && !expected_id.empty())
    RLHF_CHECK(it->is_string() && it->get<std::string>() == expected_id,
               "--env_command '{}': answer {} is for episode {}, but request {} was for episode "
               "'{}' (answers must come one per request, in order): '{}'",
               program, line_no, it->dump(), line_no, expected_id, quoted);
  EnvAnswer a;
  if (auto it = j.find("observation"); it != j.end() && !it->is_null()) {
    RLHF_CHECK(it->is_string(),
               "--env_command '{}': answer {}: \"observation\" must be a string: '{}'\n{}", program,
               line_no, quoted, kHint);
    a.observation = it->get<std::string>();
  }
  if (auto it = j.find("done"); it != j.end() && !it->is_null()) {
    RLHF_CHECK(it->is_boolean(),
               "--env_command '{}': answer {}: \"done\" must be true or false: '{}'\n{}", program,
               line_no, quoted, kHint);
    a.done = it->get<bool>();
  }
  if (auto it = j.find("reward"); it != j.end() && !it->is_null()) {
    RLHF_CHECK(it->is_number() && std::isfinite(it->get<double>()),
               "--env_command '{}': answer {}: \"reward\" must be a finite number: '{}'\n{}",
               program, line_no, quoted, kHint);
    a.reward = it->get<double>();
  }
  return a;
}

std::vector<EnvAnswer> ToyEnvironment::step(const std::vector<EnvQuery>& queries) {
  std::vector<EnvAnswer> out;
  out.reserve(queries.size());
  for (const EnvQuery& q : queries) {
    // id "<prompt index>-<sample index>"
    const size_t dash = q.id.find('-');
    int64_t p = -1, s = -1;
    const char* b = q.id.data();
    const char* e = b + q.id.size();
    const bool ok = dash != std::string::npos && std::from_chars(b, b + dash, p).ptr == b + dash &&
                    std::from_chars(b + dash + 1, e, s).ptr == e && p >= 0 && s >= 0;
    RLHF_CHECK(ok, "builtin:toy: episode id '{}' is not '<prompt index>-<sample index>'", q.id);
    EnvAnswer a;
    a.observation = fmt::format("<{}>", (p + s + q.turn) % 10);
    a.reward = double(q.turn + 1) / double(kTurns);
    a.done = q.turn + 1 >= kTurns;
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace rlhf::rl

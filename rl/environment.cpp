#include "rl/environment.h"

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "io/text_util.h"
#include "rl/env_command.h"
#include "rl/subprocess.h"

namespace rlhf::rl {

namespace {

// The environment on a tensor-parallel engine's rank other than 0: rank 0 runs the real one and
// sends its answers (rl/env_share.h), so this one is never asked.
class TpPeerEnvironment : public Environment {
 public:
  explicit TpPeerEnvironment(std::string spec) : spec_(std::move(spec)) {}
  std::string name() const override { return spec_; }
  std::vector<EnvAnswer> step(const std::vector<EnvQuery>&) override {
    RLHF_FAIL(
        "internal error: --env_command '{}' asked on a tensor-parallel rank other than 0 (only "
        "TP rank 0 runs the environment)",
        spec_);
  }

 private:
  std::string spec_;
};

}  // namespace

std::unique_ptr<Environment> make_environment(const std::string& spec, double timeout_s,
                                              int tp_rank) {
  RLHF_CHECK(!io::trim_whitespace(spec).empty(), "--env_command is empty");
  const bool builtin = spec.rfind("builtin:", 0) == 0;
  if (builtin)
    RLHF_CHECK(spec == "builtin:toy",
               "--env_command {}: unknown built-in environment\nhint: the built-in one is "
               "builtin:toy; anything else is run as a program",
               spec);
  if (tp_rank != 0) return std::make_unique<TpPeerEnvironment>(spec);
  if (builtin) return std::make_unique<ToyEnvironment>();
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

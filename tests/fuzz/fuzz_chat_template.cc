// libFuzzer harness: the Jinja engine of chat templates (io/jinja) on untrusted template text,
// parsed and rendered with a conversation that has a system prompt, tool calls, a tool result and
// tools. Parse and render errors are rlhf::Error; a crash, a hang (-timeout), unbounded recursion
// or memory is a bug. The step and output limits are lowered so that each input stays fast.
#include <string>

#include "io/jinja/jinja.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

const rlhf::io::jinja::Json& context() {
  static const rlhf::io::jinja::Json c = rlhf::io::jinja::Json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "documents": null,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Zürich? 🙂"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"location": "Zürich"}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"sky\": \"clear\"}"},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nClear."}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get it.",
      "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
      "required": ["location"]}}}]
  })");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    const rlhf::io::jinja::Template t(rlhf::fuzz::bytes(data, size));
    rlhf::io::jinja::RenderOptions o;
    o.now = 1721952000;
    o.max_steps = 200000;
    o.max_output = 1 << 20;
    t.render(context(), o);
  });
  return 0;
}

